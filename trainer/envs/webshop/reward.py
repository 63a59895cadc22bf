"""WebShop's reward, after ``web_agent_site/engine/goal.py`` (Yao et al. 2022).

reward = r_type * (n_attr_matched + n_option_matched + price_ok) / (n_goal_attrs + n_goal_options + 1)

Two stand-ins keep it offline and light, both documented where they are used:
- ``token_set_ratio`` re-implements thefuzz's scorer with difflib (same token-set construction);
- the type reward's spaCy noun filter becomes a content-word filter (stop words and numbers out).
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from typing import Any

EXACT_MATCH_OPTS = ("size",)
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
"""Price ceilings a goal may name (WebShop's ``PRICE_RANGE``)."""

_COLORS = (
    "black white grey gray silver gold rose red pink purple lavender blue navy teal green olive "
    "yellow orange brown beige ivory cream tan khaki burgundy wine coral mint clear"
).split()

_STOP = set(
    "a an the and or of for with in on to by at from as is it its this that these those be are was "
    "set pack count piece pcs inch inches oz fl ft lb x us new".split()
)


def _tokens(s: str) -> list[str]:
    return re.sub(r"[^0-9a-z]+", " ", s.lower()).split()


def _ratio(a: str, b: str) -> int:
    if not a and not b:
        return 0
    return round(100 * SequenceMatcher(None, a, b).ratio())


def token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz's ``token_set_ratio``: compare the shared tokens with each side's full token set."""
    t1, t2 = set(_tokens(s1)), set(_tokens(s2))
    if not t1 or not t2:
        return 0
    common = " ".join(sorted(t1 & t2))
    side1 = " ".join(x for x in [common, " ".join(sorted(t1 - t2))] if x)
    side2 = " ".join(x for x in [common, " ".join(sorted(t2 - t1))] if x)
    if common and (side1 == common or side2 == common):
        return 100
    return max(_ratio(common, side1), _ratio(common, side2), _ratio(side1, side2))


def normalize_color(value: str) -> str:
    """WebShop's ``normalize_color``: the first known colour word in the value, else the value."""
    words = _tokens(value)
    for color in _COLORS:
        if color in words:
            return color
    return value


def content_words(title: str) -> list[str]:
    """Stand-in for WebShop's spaCy noun filter: alphabetic non-stop words of a title."""
    return [t for t in _tokens(title) if t.isalpha() and len(t) > 1 and t not in _STOP]


def get_type_reward(purchased: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    """Whether the purchased product is the kind of product asked for (query, category path, title)."""
    query_match = purchased["query"] == goal["query"]
    bought_path = {x.strip() for x in purchased["product_category"].split("›")}
    goal_path = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought_path & goal_path) >= 2
    bought_words, desired_words = set(content_words(purchased["name"])), set(content_words(goal["name"]))
    title_score = len(bought_words & desired_words) / len(desired_words) if desired_words else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def _in_text(value: str, product: dict[str, Any]) -> bool:
    return (
        value in product["Title"].lower()
        or value in " ".join(product["BulletPoints"]).lower()
        or value in product["Description"].lower()
    )


def get_attribute_reward(purchased: dict[str, Any], goal: dict[str, Any]) -> tuple[float, int]:
    """Goal attributes found (fuzzily) in the product's attributes, else literally in its texts."""
    matches = 0
    for g_attr in goal["attributes"]:
        if any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in purchased["Attributes"]):
            matches += 1
        elif _in_text(g_attr, purchased):
            matches += 1
    return matches / len(goal["attributes"]), matches


def get_option_reward(
    purchased: dict[str, Any], goal_options: list[str], chosen: dict[str, str]
) -> tuple[float | None, int]:
    """Chosen options that match a goal option (size exactly, others fuzzily), else found in texts."""
    chosen = {k: normalize_color(v) for k, v in chosen.items()}
    goal_options = [normalize_color(o) for o in goal_options]
    matches = 0
    for key, value in chosen.items():
        if key.lower() in EXACT_MATCH_OPTS:
            matched = value in goal_options
        else:
            matched = any(token_set_ratio(g, value) > 85 for g in goal_options)
        if matched or _in_text(value, purchased):
            matches += 1
    return (matches / len(goal_options) if goal_options else None), matches


def get_reward(
    purchased: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str]
) -> tuple[float, dict[str, Any]]:
    """WebShop's total reward for buying ``purchased`` at ``price`` with ``options``, and its parts.

    As in WebShop the sum can exceed the denominator when extra chosen options match; the score
    is capped at 1.0 here so that a reward of 1.0 means exactly "everything asked for".
    """
    goal_options = list(goal["goal_options"].values())
    r_type = get_type_reward(purchased, goal)
    r_price = price <= goal["price_upper"]
    r_att, n_att = get_attribute_reward(purchased, goal)
    r_option, n_opt = get_option_reward(purchased, goal_options, options)
    total = (n_att + n_opt + r_price) / (len(goal["attributes"]) + len(goal_options) + 1)
    total = min(1.0, total * r_type["r_type"])
    parts = {"r_att": r_att, "r_option": r_option, "r_price": r_price} | r_type
    return total, parts
