"""WebShop's text environment (``web_agent_text_env.py``) over the synthetic or the real catalogue.

Pages and observations follow WebShop's simple ``text`` observation mode (visible page texts joined
by ``[SEP]``, as in the ReAct prompts): search page -> results (10 per page, ``Next >``/``< Prev``,
``Back to Search``) -> item page (options by group, ``Description``, ``Features``, ``Reviews``,
``Buy Now``, ``< Prev``) -> sub-pages -> done page. Actions are ``search[keywords]`` and
``click[button]``; clickables are lower-cased as in WebShop's ``get_available_actions``.

One choice differs from WebShop, for a cleaner RL signal: a click on something that is not on the
page, or a search where there is no search bar, gets an invalid-action observation (WebShop silently
does nothing and allows a search from any page). The reward is WebShop master's (``reward.py``).
"""

from __future__ import annotations

import functools
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rank_bm25 import BM25Okapi

from trainer.envs.base import StepInfo, TextEnv, register_env
from trainer.envs.splits import load_split, split_path
from trainer.envs.webshop.catalogue import (
    DATA_ENV_VAR,
    generate_catalogue,
    goal_option_clicks,
    load_real_webshop,
    make_goal,
    normalize_products,
    product_prices,
)
from trainer.envs.webshop.reward import get_reward

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
END_BUTTON, NEXT_PAGE, PREV_PAGE, BACK_TO_SEARCH = "buy now", "next >", "< prev", "back to search"
SUB_PAGES = ("description", "features", "reviews")
CATALOGUE_SEED = 0
_ACTION = re.compile(r"\b(search|click)\s*\[\s*([^\[\]]*?)\s*\]", re.IGNORECASE)


def _tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class SearchEngine:
    """BM25 over WebShop's indexed fields (title, description, first bullet, options)."""

    def __init__(self, products: list[dict[str, Any]]) -> None:
        self.asins = [p["asin"] for p in products]
        docs = []
        for p in products:
            option_text = ", and ".join(f"{k}: {', '.join(v)}" for k, v in p["options"].items())
            bullet = p["BulletPoints"][0] if p["BulletPoints"] else ""
            docs.append(_tokenize(" ".join([p["Title"], p["Description"], bullet, option_text])))
        self.bm25 = BM25Okapi(docs)

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The top ``k`` asins that share at least one term with ``keywords``, best first."""
        query = [t for t in dict.fromkeys(_tokenize(keywords)) if t in self.bm25.idf]
        if not query:
            return []
        scores = self.bm25.get_scores(query)
        top = np.argsort(-scores, kind="stable")[:k]
        return [self.asins[i] for i in top if scores[i] > 0]


@dataclass
class World:
    """A catalogue with its search engine and goals, shared by every env built on it."""

    products: dict[str, dict[str, Any]]
    prices: dict[str, float]
    engine: SearchEngine
    train_goals: list[dict[str, Any]]
    eval_goals: list[dict[str, Any]]
    synthetic: bool


@functools.lru_cache(maxsize=2)
def synthetic_world(seed: int = CATALOGUE_SEED) -> World:
    """The generated catalogue (~0.3 s to build, so it lives in memory rather than on disk)."""
    cat = generate_catalogue(seed)
    products = normalize_products(cat["items"], cat["attributes"])
    eval_goals = load_split(split_path("WebShop-synth")) if seed == CATALOGUE_SEED else []
    by_asin = {p["asin"]: p for p in products}
    for g in eval_goals:
        if g["asin"] not in by_asin or by_asin[g["asin"]]["Title"] != g["name"]:
            raise RuntimeError(
                f"the frozen WebShop-synth eval split names {g['asin']} ({g['name']!r}), which the "
                "catalogue generator no longer produces: the generator changed since the split was frozen"
            )
    return World(
        products=by_asin,
        prices=product_prices(products),
        engine=SearchEngine(products),
        train_goals=[g for g in cat["goals"] if g["split"] == "train"],
        eval_goals=eval_goals,
        synthetic=True,
    )


@functools.lru_cache(maxsize=2)
def real_world(folder: str) -> World:
    """Real WebShop data; its eval goals are WebShop's first 500 (its test split), train from 1,500 on.

    Small files (under 2,000 goals) put the first fifth in eval and the rest in train.
    """
    products, goals = load_real_webshop(folder)
    if len(goals) >= 2000:
        n_eval, n_skip = 500, 1500
    else:
        n_eval = n_skip = max(1, len(goals) // 5)
    return World(
        products={p["asin"]: p for p in products},
        prices=product_prices(products),
        engine=SearchEngine(products),
        train_goals=goals[n_skip:],
        eval_goals=goals[:n_eval],
        synthetic=False,
    )


def synthetic_eval_goals(seed: int = CATALOGUE_SEED) -> list[dict[str, Any]]:
    """The eval goals as the generator makes them (what ``freeze`` writes to the split file)."""
    return [g for g in generate_catalogue(seed)["goals"] if g["split"] == "eval"]


class WebShopEnv(TextEnv):
    """WebShop's text environment. ``data_dir`` (or ``$WEBSHOP_DATA``) selects real WebShop data."""

    name = "WebShop-synth"
    max_turns = 15
    action_syntax = (
        "Write one action: search[keywords] on the search page, or click[button] where button is a "
        "clickable text of the current page (an item id such as click[B0ABC12345], an option value, "
        "click[Buy Now], click[< Prev], click[Next >], click[Back to Search], click[Description])."
    )
    instructions = (
        "You are shopping on WebShop for the product in the instruction. Search with keywords, open "
        "promising items from the results, check that they have the requested attributes and a price "
        "under the limit, click the requested options (such as size or color) on the item page, then "
        "click Buy Now. The purchase ends the episode and is scored by how well it matches."
    )

    def __init__(self, split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(split)
        self.world = real_world(str(Path(data_dir).resolve())) if data_dir else synthetic_world()
        self.goal_record: dict[str, Any] = {}
        self._rng = random.Random(0)
        self.page = "search"
        self.keywords = ""
        self.results: list[str] = []
        self.page_no = 1
        self.asin: str | None = None
        self.options: dict[str, str] = {}
        self.sub_page = ""
        self._score = 0.0
        self._expert_searches = 0

    def num_instances(self) -> int | None:
        return len(self.world.eval_goals) if self.split == "eval" else None

    # ---- episodes ---------------------------------------------------------------------------
    def _pick_goal(self, seed: int) -> dict[str, Any]:
        if self.split == "eval":
            return self.world.eval_goals[seed % len(self.world.eval_goals)]
        rng = random.Random(f"webshop-train/{seed}")
        base = self.world.train_goals[rng.randrange(len(self.world.train_goals))]
        if not self.world.synthetic or rng.random() < 0.5:
            return base
        # a fresh goal for the same target: other attributes, options, ceiling or template
        return make_goal(rng, self.world.products[base["asin"]], "train")

    def _reset(self, seed: int) -> tuple[str, StepInfo]:
        self.goal_record = self._pick_goal(seed)
        self._rng = random.Random(seed)
        self._expert_searches = 0
        self._go_search_page()
        return self.observation(), self._info()

    def _go_search_page(self) -> None:
        self.page, self.keywords, self.results, self.page_no = "search", "", [], 1
        self.asin, self.options, self.sub_page = None, {}, ""

    # ---- pages ------------------------------------------------------------------------------
    def clickables(self) -> list[str]:
        """WebShop's ``get_available_actions()["clickables"]`` for the current page."""
        if self.page == "search":
            return ["search"]
        if self.page == "results":
            buttons = [BACK_TO_SEARCH] + [PREV_PAGE] * (self.page_no > 1)
            buttons += [NEXT_PAGE] * (self.page_no * PRODUCT_WINDOW < len(self.results))
            return buttons + [a.lower() for a in self._page_asins()]
        if self.page == "item":
            values = [v for vs in self.world.products[self.asin]["options"].values() for v in vs]
            return [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, END_BUTTON, *values]
        if self.page == "sub":
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def available_actions(self) -> dict[str, Any]:
        """WebShop's ``get_available_actions``: ``has_search_bar`` and ``clickables``."""
        return {"has_search_bar": self.page == "search", "clickables": self.clickables()}

    def admissible_actions(self) -> list[str]:
        """Executable actions; on the search page ``search[<keywords>]`` stands for any search."""
        if self.page == "search":
            return ["search[<keywords>]"]
        return [f"click[{c}]" for c in self.clickables()]

    def _page_asins(self) -> list[str]:
        start = (self.page_no - 1) * PRODUCT_WINDOW
        return self.results[start : start + PRODUCT_WINDOW]

    def observation(self) -> str:
        """The current page in WebShop's simple text mode."""
        head = ["Instruction:", self.goal_record["instruction_text"]]
        if self.page == "search":
            parts = ["WebShop", *head, "Search"]
        elif self.page == "results":
            parts = [*head, "Back to Search", f"Page {self.page_no} (Total results: {len(self.results)})"]
            parts += ["< Prev"] * (self.page_no > 1)
            parts += ["Next >"] * (self.page_no * PRODUCT_WINDOW < len(self.results))
            for asin in self._page_asins():
                p = self.world.products[asin]
                parts += [asin, p["Title"], p["Price"]]
        elif self.page == "item":
            p = self.world.products[self.asin]
            parts = [*head, "Back to Search", "< Prev"]
            for group, values in p["options"].items():
                parts += [group, *values]
            parts += [p["Title"], f"Price: {p['Price']}", f"Rating: {p['Rating']}"]
            parts += ["Description", "Features", "Reviews", "Buy Now"]
        elif self.page == "sub":
            p = self.world.products[self.asin]
            parts = [*head, "Back to Search", "< Prev"]
            if self.sub_page == "description":
                parts.append(p["Description"] or "N.A.")
            elif self.sub_page == "features":
                parts += p["BulletPoints"] or ["N.A."]
            else:
                for r in p["Reviews"]:
                    parts += [f'"{r["title"]}"', str(r["score"]), r["body"]]
                parts += ["No reviews found"] * (not p["Reviews"])
        else:
            parts = ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{self._score:.2f}"]
        return " [SEP] ".join(parts)

    # ---- actions ----------------------------------------------------------------------------
    def parse_action(self, text: str) -> str | None:
        """The first ``search[...]`` or ``click[...]`` in the text, lower-cased as WebShop does."""
        m = _ACTION.search(text)
        if m is None or not m.group(2):
            return None
        return f"{m.group(1).lower()}[{m.group(2).lower()}]"

    def _step(self, action: str) -> tuple[str, float, bool, StepInfo]:
        kind, arg = action[: action.index("[")], action[action.index("[") + 1 : -1]
        if kind == "search":
            if self.page != "search":
                return self._refuse(
                    action, "there is no search bar on this page; click[Back to Search] first"
                )
            self.keywords, self.page, self.page_no = arg, "results", 1
            self.results = self.world.engine.search(arg)
            return self.observation(), 0.0, False, self._info()
        if arg not in self.clickables() or arg == "search":
            return self._refuse(action, "that is not a clickable button on this page")
        if arg == END_BUTTON:
            return self._buy()
        if arg == BACK_TO_SEARCH:
            self._go_search_page()
        elif arg in (NEXT_PAGE, PREV_PAGE) and self.page == "results":
            self.page_no += 1 if arg == NEXT_PAGE else -1
        elif arg == PREV_PAGE:
            self.page, self.options = ("item", self.options) if self.page == "sub" else ("results", {})
        elif self.page == "results":
            self.page, self.asin, self.options = "item", arg.upper(), {}
        elif arg in SUB_PAGES:
            self.page, self.sub_page = "sub", arg
        else:  # an option value: it belongs to the first group that lists it
            product = self.world.products[self.asin]
            group = next(g for g, vs in product["options"].items() if arg in vs)
            self.options[group] = arg
        return self.observation(), 0.0, False, self._info()

    def _buy(self) -> tuple[str, float, bool, StepInfo]:
        product = self.world.products[self.asin]
        self._score, parts = get_reward(product, self.goal_record, self.world.prices[self.asin], self.options)
        self.page = "done"
        info = self._info(success=self._score >= 1.0 - 1e-9)
        info.extra |= {
            "score": self._score,
            "reward_parts": parts,
            "purchased": self.asin,
            "options": dict(self.options),
        }
        return self.observation(), self._score, True, info

    def _refuse(self, action: str, why: str) -> tuple[str, float, bool, StepInfo]:
        obs = f"Invalid action: {action}: {why}. Valid now: {', '.join(self.admissible_actions())}"
        return obs, 0.0, False, self._info(invalid=True)

    def _info(self, success: bool = False, invalid: bool = False) -> StepInfo:
        return StepInfo(
            goal=self.goal_record["instruction_text"],
            success=success,
            invalid_action=invalid,
            admissible_actions=self.admissible_actions(),
            extra={"available_actions": self.available_actions(), "page": self.page},
        )

    # ---- the oracle -------------------------------------------------------------------------
    def expert_action(self) -> str:
        """Search the instruction, page to the target, choose its goal options, buy.

        Privileged: it knows the target asin. If the instruction's results do not hold the target
        it goes back and searches the target's title instead.
        """
        target = self.goal_record["asin"]
        if self.page == "search":
            self._expert_searches += 1
            query = self.goal_record["instruction_text"]
            return f"search[{query if self._expert_searches == 1 else self.world.products[target]['Title']}]"
        if self.page == "results":
            if target in self._page_asins():
                return f"click[{target.lower()}]"
            later = target in self.results[self.page_no * PRODUCT_WINDOW :]
            return f"click[{NEXT_PAGE if later else BACK_TO_SEARCH}]"
        if self.page == "sub" or (self.page == "item" and self.asin != target):
            return f"click[{PREV_PAGE}]"
        for group, value in goal_option_clicks(self.world.products[target], self.goal_record).items():
            if self.options.get(group) != value:
                return f"click[{value}]"
        return f"click[{END_BUTTON}]"


register_env("WebShop-synth")(WebShopEnv)


@register_env("WebShop")
class RealWebShopEnv(WebShopEnv):
    """WebShop on its real product data, from ``data_dir`` or ``$WEBSHOP_DATA``."""

    name = "WebShop"

    def __init__(self, split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> None:
        folder = data_dir or os.environ.get(DATA_ENV_VAR)
        if not folder:
            raise RuntimeError(
                f"WebShop needs its data files: set {DATA_ENV_VAR} to a folder holding items_shuffle*.json "
                "and items_ins_v2*.json (github.com/princeton-nlp/WebShop, setup.sh), or use WebShop-synth"
            )
        super().__init__(split, data_dir=folder)


def random_valid_action(env: WebShopEnv, rng: random.Random) -> str:
    """A uniformly random executable action (the search page searches the instruction text)."""
    if env.page == "search":
        return f"search[{env.goal_record['instruction_text']}]"
    return rng.choice(env.admissible_actions())
