"""WebShop's reward as its benchmarks report it: princeton-nlp/WebShop master (64fa2a5),
``web_agent_site/engine/goal.py`` and ``normalize.py`` (Yao et al. 2022).

reward = r_type * (n_attrs_matched + n_goal_options_matched + price_ok) / (n_attrs + n_goal_options + 1)

Each count is at most its term of the denominator, so the reward lies in [0, 1] and equals 1.0 only
when the type, every goal attribute, every goal option and the price are all right.

Two stand-ins keep it offline and light, each documented where it is used:
- ``token_set_ratio`` is thefuzz 0.19's (WebShop's pin) with difflib, as thefuzz runs without
  python-Levenshtein; thefuzz 0.20+ (rapidfuzz) decides some pairs differently;
- the type reward's spaCy noun filter (``en_core_web_sm`` tags) becomes a content-word filter.

WebShop's v2 branch scores options differently (sizes matched exactly, a goal option found in the
product's texts counts, synonyms looked up online); it is not what WebShop's results use and is not
offered here. ``tests/trainer/envs/data/webshop_reward_vectors.jsonl`` holds 600 cases scored by the
original master code; the tests check this module against them.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from typing import Any

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
"""Price ceilings a goal may name (WebShop's ``PRICE_RANGE``)."""

COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown "
    "burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac "
    "copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite "
    "grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light "
    "lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural "
    "navy nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire "
    "seashell silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet "
    "walnut wheat white wine yellow"
).split()
"""WebShop's ``COLOR_SET``, in its order: the first one found inside a value wins."""

# spaCy's English stop words (spacy/lang/en/stop_words.py), for the type reward's noun filter.
_STOP_WORDS = frozenset(
    """
a about above across after afterwards again against all almost alone along already also although
always am among amongst amount an and another any anyhow anyone anything anyway anywhere are around
as at back be became because become becomes becoming been before beforehand behind being below
beside besides between beyond both bottom but by call can cannot ca could did do does doing done down
due during each eight either eleven else elsewhere empty enough even ever every everyone everything
everywhere except few fifteen fifty first five for former formerly forty four from front full further
get give go had has have he hence her here hereafter hereby herein hereupon hers herself him himself
his how however hundred i if in indeed into is it its itself keep last latter latterly least less
just made make many may me meanwhile might mine more moreover most mostly move much must my myself
name namely neither never nevertheless next nine no nobody none noone nor not nothing now nowhere of
off often on once one only onto or other others otherwise our ours ourselves out over own part per
perhaps please put quite rather re really regarding same say see seem seemed seeming seems serious
several she should show side since six sixty so some somehow someone something sometime sometimes
somewhere still such take ten than that the their them themselves then thence there thereafter
thereby therefore therein thereupon these they third this those though three through throughout
thru thus to together too top toward towards twelve twenty two under until up unless upon us used
using various very via was we well were what whatever when whence whenever where whereafter
whereas whereby wherein whereupon wherever whether which while whither who whoever whole whom whose
why will with within without would yet you your yours yourself yourselves
""".split()
)


# ---- thefuzz 0.19's token_set_ratio ------------------------------------------------------------------
_LATIN1_HIGH = {c: None for c in range(128, 256)}
_NON_WORD = re.compile(r"(?ui)\W")


def _full_process(s: str) -> str:
    """thefuzz's ``full_process(force_ascii=True)``: drop chars 128-255, non-word chars to spaces, lower."""
    return _NON_WORD.sub(" ", s.translate(_LATIN1_HIGH)).lower().strip()


def _ratio(a: str, b: str) -> int:
    """thefuzz 0.19's ``ratio`` on difflib: equal -> 100, one empty -> 0, else rounded 100 * ratio."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * SequenceMatcher(None, a, b).ratio()))


def token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz 0.19's ``token_set_ratio``: the shared tokens against each side's full token set."""
    p1, p2 = _full_process(s1), _full_process(s2)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    common = " ".join(sorted(t1 & t2))
    side1 = (common + " " + " ".join(sorted(t1 - t2))).strip()
    side2 = (common + " " + " ".join(sorted(t2 - t1))).strip()
    return max(_ratio(common, side1), _ratio(common, side2), _ratio(side1, side2))


# ---- the reward's parts ------------------------------------------------------------------------------
def normalize_color(value: str) -> str:
    """WebShop's ``normalize_color``: the first ``COLOR_SET`` entry found inside the value, else the value."""
    return next((color for color in COLOR_SET if color in value), value)


def type_words(name: str) -> list[str]:
    """Stand-in for WebShop's noun filter, which keeps the lower-cased tokens that spaCy's
    ``en_core_web_sm`` tags NOUN or PROPN. Without the tagger (the model is not installable from
    PyPI): every alphabetic token except spaCy's English stop words, so adjectives and verbs count
    too. On the 600 reference cases this changes the type reward in 5 of them."""
    return [t for t in re.findall(r"[a-z]+", name.lower()) if t not in _STOP_WORDS]


def get_type_reward(purchased: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    """Whether the purchased product is the kind of product asked for (query, category path, name)."""
    query_match = purchased["query"] == goal["query"]
    bought_path = {x.strip() for x in purchased["product_category"].split("›")}
    goal_path = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought_path & goal_path) >= 2
    bought_words, desired_words = set(type_words(purchased["name"])), type_words(goal["name"])
    if desired_words:
        title_score = len(bought_words & set(desired_words)) / len(desired_words)
    else:
        title_score = 0.2
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


def get_option_reward(chosen: list[str], goal_options: list[str]) -> tuple[float | None, int]:
    """Goal options that some chosen option matches fuzzily, after colour normalisation."""
    chosen = [normalize_color(o) for o in chosen]
    goal_options = [normalize_color(o) for o in goal_options]
    matches = sum(any(token_set_ratio(c, g) > 85 for c in chosen) for g in goal_options)
    return (matches / len(goal_options) if goal_options else None), matches


def get_reward(
    purchased: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str]
) -> tuple[float, dict[str, Any]]:
    """WebShop's total reward for buying ``purchased`` at ``price`` with ``options``, and its parts.

    ``goal["goal_options"]`` is a list of values (WebShop's human goals, which its benchmarks use) or
    a dict whose values are scored like that list (master passes a dict's (name, value) pairs, which
    thefuzz then reads as their repr). Only the chosen options' values count, as in WebShop.
    """
    goal_options = goal["goal_options"]
    goal_values = list(goal_options.values() if isinstance(goal_options, dict) else goal_options)
    r_type = get_type_reward(purchased, goal)
    r_price = price <= goal["price_upper"]
    r_att, n_att = get_attribute_reward(purchased, goal)
    r_option, n_opt = get_option_reward(list(options.values()), goal_values)
    total = (n_att + n_opt + r_price) / (len(goal["attributes"]) + len(goal_values) + 1)
    total *= r_type["r_type"]
    parts = {"r_att": r_att, "r_option": r_option, "r_price": r_price} | r_type
    return total, parts
