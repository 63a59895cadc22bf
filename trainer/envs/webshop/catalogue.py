"""The WebShop-synth catalogue: products and goals in WebShop's JSON schema, deterministic from a seed.

The generator writes *raw* records in the schema of WebShop's ``items_shuffle*.json`` (name,
full_description, small_description, pricing "$12.99", customization_options, category, query,
product_category, images) plus attribute records in the schema of ``items_ins_v2*.json``
(attributes, instruction, instruction_attributes). Real WebShop files and generated ones then go
through the same ``normalize_products`` (WebShop's ``load_products``), so both give products with
``Title``, ``Description``, ``BulletPoints``, ``Reviews``, ``Rating``, ``pricing``, ``Price``,
``options``, ``Attributes``.

Each *base* product comes with a primary goal and three near-duplicate distractors that differ from
it in exactly one way: one goal attribute, one goal option value, or a price above the goal's
ceiling. A fifth of the bases (and two of the eight instruction templates) are held out for eval.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from trainer.envs.webshop.reward import (
    PRICE_RANGE,
    get_reward,
    normalize_color,
    token_set_ratio,
)

CATALOGUE_VERSION = 1
EVAL_EVERY = 5
"""Base products whose index within their category is a multiple of this are eval-only targets."""


@dataclass(frozen=True)
class Category:
    """One kind of product: where it sits in the store, what it can be, what it costs."""

    query: str
    noun: str
    category: str
    path: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: tuple[float, float]


def _c(
    query: str, noun: str, cat: str, path: str, attrs: str, opts: dict[str, str], price: tuple
) -> Category:
    return Category(
        query=query,
        noun=noun,
        category=cat,
        path=path,
        attributes=tuple(attrs.split(", ")),
        options={k: tuple(v.split(", ")) for k, v in opts.items()},
        price=price,
    )


CATEGORIES: tuple[Category, ...] = (
    _c(
        "shampoo",
        "shampoo",
        "beauty",
        "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
        "sulfate free, paraben free, cruelty free, natural ingredients, dry hair, color safe, vegan formula",
        {
            "size": "8 fl oz, 12 fl oz, 16 fl oz, 32 fl oz",
            "scent": "lavender, coconut, unscented, tea tree, citrus",
        },
        (6, 38),
    ),
    _c(
        "lipstick",
        "lipstick",
        "beauty",
        "Beauty & Personal Care › Makeup › Lips › Lipstick",
        "long lasting, highly pigmented, moisturizing, matte finish, cruelty free, paraben free",
        {
            "color": "ruby red, nude beige, coral, plum, berry wine, mauve",
            "size": "1 count, 2 count, 3 count",
        },
        (5, 29),
    ),
    _c(
        "face moisturizer",
        "face moisturizer",
        "beauty",
        "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers › Face Moisturizers",
        "oil free, fragrance free, sensitive skin, hyaluronic acid, spf 30, non comedogenic",
        {"size": "1.7 oz, 2.5 oz, 4 oz"},
        (9, 58),
    ),
    _c(
        "hair extension",
        "hair extensions",
        "beauty",
        "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories › Hair Extensions",
        "natural looking, heat resistant, clip in, easy to use, human hair",
        {
            "color": "jet black, dark brown, honey blonde, auburn, silver grey",
            "size": "14 inch, 18 inch, 22 inch",
        },
        (15, 89),
    ),
    _c(
        "headphones",
        "headphones",
        "electronics",
        "Electronics › Headphones, Earbuds & Accessories › Headphones › Over-Ear Headphones",
        "noise cancelling, wireless bluetooth, long battery life, hands free, foldable design, "
        "built-in microphone",
        {"color": "black, white, navy blue, rose gold"},
        (19, 149),
    ),
    _c(
        "phone case",
        "phone case",
        "electronics",
        "Electronics › Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
        "shockproof, slim fit, wireless charging compatible, scratch resistant, kickstand",
        {
            "color": "clear, black, midnight green, lavender purple",
            "style": "iphone 14, galaxy s22, pixel 7, moto g",
        },
        (6, 25),
    ),
    _c(
        "usb c cable",
        "usb c charging cable",
        "electronics",
        "Electronics › Computers & Accessories › Cables & Accessories › Cables & Interconnects › USB Cables",
        "fast charging, braided nylon, data transfer, tangle free, aluminum connector",
        {"size": "3 ft, 6 ft, 10 ft", "color": "black, white, red"},
        (5, 22),
    ),
    _c(
        "bluetooth speaker",
        "portable bluetooth speaker",
        "electronics",
        "Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
        "waterproof, long battery life, high fidelity, stereo pairing, dustproof",
        {"color": "black, blue, teal, red"},
        (18, 119),
    ),
    _c(
        "men t-shirt",
        "men's t-shirt",
        "fashion",
        "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
        "machine wash, cotton jersey, short sleeve, classic fit, moisture wicking, tagless",
        {
            "color": "heather grey, black, navy, olive, white",
            "size": "small, medium, large, x-large, xx-large",
        },
        (8, 30),
    ),
    _c(
        "women dress",
        "women's midi dress",
        "fashion",
        "Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual",
        "machine wash, long sleeve, polyester spandex, elastic waist, hand wash only, button closure",
        {
            "color": "floral blue, black, burgundy, khaki, mint",
            "size": "x-small, small, medium, large, x-large",
        },
        (17, 55),
    ),
    _c(
        "running shoes",
        "men's running shoes",
        "fashion",
        "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running › Road Running",
        "non slip, rubber sole, lightweight, breathable mesh, arch support, lace up",
        {"color": "black white, grey, blue, orange", "size": "us 7, us 8, us 9, us 10, us 11, us 12"},
        (29, 99),
    ),
    _c(
        "crossbody bag",
        "women's crossbody bag",
        "fashion",
        "Clothing, Shoes & Jewelry › Women › Handbags & Wallets › Cross-Body Bags",
        "vegan leather, adjustable strap, zipper closure, rfid blocking, multiple pockets",
        {"color": "black, tan, burgundy, cream"},
        (14, 60),
    ),
    _c(
        "protein bar",
        "protein bars",
        "food",
        "Grocery & Gourmet Food › Snacks & Sweets › Snack Bars › Protein Bars",
        "gluten free, low sugar, high protein, keto friendly, non gmo, plant based",
        {
            "flavor name": "chocolate chip, peanut butter, cookie dough, vanilla almond",
            "size": "12 count, 24 count",
        },
        (12, 45),
    ),
    _c(
        "ground coffee",
        "ground coffee",
        "food",
        "Grocery & Gourmet Food › Beverages › Coffee › Ground Coffee",
        "organic, fair trade, medium roast, low acid, kosher",
        {"flavor name": "original, hazelnut, french vanilla, caramel", "size": "12 ounce, 2 pound"},
        (7, 35),
    ),
    _c(
        "herbal tea",
        "herbal tea bags",
        "food",
        "Grocery & Gourmet Food › Beverages › Tea › Herbal",
        "caffeine free, certified organic, individually wrapped, non gmo, kosher",
        {
            "flavor name": "chamomile, peppermint, ginger lemon, hibiscus",
            "size": "20 count, 40 count, 100 count",
        },
        (4, 24),
    ),
    _c(
        "beef jerky",
        "beef jerky",
        "food",
        "Grocery & Gourmet Food › Meat & Seafood › Jerky & Dried Meats › Beef",
        "high protein, low fat, gluten free, ready to eat, no nitrates",
        {
            "flavor name": "original, teriyaki, peppered, sweet & spicy",
            "size": "3.25 ounce, 8 ounce, 16 ounce",
        },
        (6, 39),
    ),
    _c(
        "office chair",
        "office chair",
        "furniture",
        "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs › Desk Chairs",
        "lumbar support, height adjustable, easy assembly, high back, pu leather, mesh back",
        {"color": "black, grey, white, brown"},
        (59, 299),
    ),
    _c(
        "coffee table",
        "coffee table",
        "furniture",
        "Home & Kitchen › Furniture › Living Room Furniture › Tables",
        "easy assembly, solid wood, storage space, mid century, lift top",
        {"color": "walnut, espresso, natural oak, white"},
        (49, 249),
    ),
    _c(
        "bookshelf",
        "bookshelf",
        "furniture",
        "Home & Kitchen › Furniture › Home Office Furniture › Bookcases",
        "easy assembly, engineered wood, space saving, anti tip kit, industrial style",
        {"color": "rustic brown, black, white", "size": "3 tier, 4 tier, 5 tier"},
        (35, 159),
    ),
    _c(
        "bed sheets",
        "bed sheet set",
        "furniture",
        "Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
        "deep pocket, breathable, machine washable, microfiber, wrinkle resistant, hypoallergenic",
        {"color": "white, grey, navy, sage green, ivory", "size": "twin, full, queen, king"},
        (19, 89),
    ),
    _c(
        "throw pillow cover",
        "throw pillow covers",
        "furniture",
        "Home & Kitchen › Home Décor Products › Decorative Pillows, Inserts & Covers › Throw Pillow Covers",
        "double sided, hidden zipper, velvet, living room, set of 2",
        {"color": "emerald, mustard, blush, charcoal", "size": "18 x 18 inch, 20 x 20 inch"},
        (9, 35),
    ),
)

_ASIN_CHARS = "0123456789ABCDEFGHJKLMNPQRSTUVWXYZ"
_SYLLABLES = "lu mo ra ve ki zo na pe tri sol ar den fa bel cor vi ta nor qu ix el om".split()
_DESC_OPENERS = (
    "Made for everyday use and built to last.",
    "Designed with care for people who want reliable quality.",
    "A customer favourite, now with an improved design.",
    "Thoughtfully made and tested for daily use.",
)
_REVIEW_TEXTS = (
    ("Great value", 5, "Exactly as described, would buy again."),
    ("Does the job", 4, "Works well, arrived quickly."),
    ("Okay", 3, "Decent for the price, nothing special."),
    ("Not for me", 2, "Quality was lower than I hoped."),
)

# ---- instruction templates: the first six for train, the last two only in eval -------------------
TEMPLATES: tuple[str, ...] = (
    "i need {attrs} {noun} with {opts_kv}, and price lower than {price} dollars",
    "i am looking for {noun} that is {attrs}, in {opts}, and price lower than {price} dollars",
    "find me {attrs} {noun} with {opts}, and price lower than {price} dollars",
    "i want to buy {noun} which is {attrs} and comes in {opts}, and price lower than {price} dollars",
    "looking for {attrs} {noun}, {opts} please, and price lower than {price} dollars",
    "can you get me {noun} that are {attrs} in {opts}, with price lower than {price} dollars",
    "show me {noun} that is {attrs}; i prefer {opts_kv}. keep the price below {price} dollars",
    "{noun} needed: must be {attrs}, pick {opts}, and the price must not exceed {price} dollars",
)
TRAIN_TEMPLATES = tuple(range(6))
EVAL_ONLY_TEMPLATES = (6, 7)
"""Eval goals use these for half of their instructions, the train templates for the other half."""


def _check_category(cat: Category) -> None:
    """Attributes and option values that WebShop's reward would take for one another must not share
    a category.

    Sizes are only required to differ after colour normalisation: catalogue version 1 (frozen with
    the eval split) was written for a reward that matched sizes exactly, and WebShop master's fuzzy
    matching takes several of its sizes for one another (12 for 16 fl oz, 1 for 2 count, large for
    x-large), so a goal asking for one of those is also met by its neighbour.
    """

    def confusable(a: str, b: str, group: str) -> bool:
        if group:  # an option value: the reward compares values after colour normalisation
            a, b = normalize_color(a), normalize_color(b)
            if a == b or group == "size":
                return a == b
        return a in b or b in a or token_set_ratio(a, b) > 85

    groups = [("", cat.attributes), *cat.options.items()]
    for group, values in groups:
        for i, a in enumerate(values):
            for b in values[i + 1 :]:
                if confusable(a, b, group):
                    raise ValueError(f"{cat.query}: {a!r} and {b!r} are confusable")


def _brand(rng: random.Random) -> str:
    return "".join(rng.sample(_SYLLABLES, 2)).capitalize() + rng.choice(["", "co", "ly", "ix"])


def _price_upper(rng: random.Random, price: float) -> float:
    """WebShop's rule: two of the next four multiples of ten above the price; the larger is the ceiling."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    return sorted(rng.sample(above, 2))[1]


def _raw_item(
    asin: str, cat: Category, brand: str, attrs: list[str], opts: dict[str, list[str]], price: float, rng
) -> dict[str, Any]:
    shown = attrs[:2]
    name = f"{brand} {cat.noun.title()} - {', '.join(a.title() for a in shown)}"
    bullets = [f"{a.upper()}: this {cat.noun} is {a}." for a in attrs]
    bullets.append(f"WHAT YOU GET: one {cat.noun} from {brand} and friendly customer service.")
    description = f"{rng.choice(_DESC_OPENERS)} The {brand} {cat.noun} is {' and '.join(attrs[::-1])}."
    reviews = [
        {"title": t, "score": s, "body": b} for t, s, b in rng.sample(_REVIEW_TEXTS, rng.randint(0, 3))
    ]
    return {
        "asin": asin,
        "name": name,
        "full_description": description,
        "small_description": bullets,
        "pricing": f"${price:.2f}",
        "customization_options": {
            group: [{"value": v, "image": None} for v in values] for group, values in opts.items()
        },
        "category": cat.category,
        "query": cat.query,
        "product_category": cat.path,
        "images": [""],
        "reviews": reviews,
        "average_rating": round(sum(r["score"] for r in reviews) / len(reviews), 1) if reviews else "N.A.",
    }


def generate_catalogue(seed: int = 0, bases_per_category: int = 20) -> dict[str, Any]:
    """Raw products, their attribute records and the primary goal of every base product.

    Returns ``{"items": [...], "attributes": {asin: {...}}, "goals": [...], "distractors": {asin:
    [asin, ...]}}``; each goal carries ``split`` ("train" or "eval") and the ``template`` index it
    was written with; ``distractors`` lists each target's near-duplicates (attribute, option, price).
    """
    shop = _Shop(random.Random(f"webshop-synth/{CATALOGUE_VERSION}/{seed}"))
    goals: list[dict[str, Any]] = []
    distractors: dict[str, list[str]] = {}
    for cat in CATEGORIES:
        _check_category(cat)
        for b in range(bases_per_category):
            split = "eval" if b % EVAL_EVERY == 0 else "train"
            base = shop.add_base(cat)
            goal = make_goal(shop.rng, shop.last_product(), split)
            goals.append(goal)
            distractors[goal["asin"]] = shop.add_near_duplicates(base, goal)
    order = list(range(len(shop.items)))
    shop.rng.shuffle(order)  # like items_shuffle.json: targets are not first among their distractors
    items = [shop.items[i] for i in order]
    return {"items": items, "attributes": shop.attributes, "goals": goals, "distractors": distractors}


@dataclass(frozen=True)
class _Variant:
    """What a product is apart from its brand: the same for a base and the distractors that copy it."""

    cat: Category
    attrs: list[str]
    opts: dict[str, list[str]]
    price: float


class _Shop:
    """The catalogue being written: raw items and attribute records, every draw from one generator (the
    order of the draws is the catalogue: changing it changes every product after)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.items: list[dict[str, Any]] = []
        self.attributes: dict[str, dict[str, Any]] = {}

    def add(self, brand: str, variant: _Variant) -> str:
        asin = "B0" + "".join(self.rng.choices(_ASIN_CHARS, k=8))
        while asin in self.attributes:
            asin = "B0" + "".join(self.rng.choices(_ASIN_CHARS, k=8))
        self.items.append(self._raw_item(asin, brand, variant))
        self.attributes[asin] = {"attributes": list(variant.attrs)}
        return asin

    def _raw_item(self, asin: str, brand: str, v: _Variant) -> dict[str, Any]:
        return _raw_item(asin, v.cat, brand, v.attrs, v.opts, v.price, self.rng)

    def last_product(self) -> dict[str, Any]:
        return normalize_products(self.items[-1:], self.attributes)[0]

    def add_base(self, cat: Category) -> _Variant:
        """A base product: three of the category's attributes, 2-4 values per option group, a price."""
        rng = self.rng
        brand = _brand(rng)
        attrs = rng.sample(cat.attributes, 3)
        opts = {
            g: sorted(rng.sample(vals, min(len(vals), rng.randint(2, 4))), key=vals.index)
            for g, vals in cat.options.items()
        }
        price = round(rng.uniform(*cat.price), 0) - 0.01
        base = _Variant(cat, attrs, opts, price)
        self.add(brand, base)
        return base

    def add_near_duplicates(self, base: _Variant, goal: dict[str, Any]) -> list[str]:
        """Three distractors, each differing from the base in one way the goal asks about: one goal
        attribute swapped, the goal's option value missing, the price above the goal's ceiling."""
        rng, cat = self.rng, base.cat
        other_attr = rng.choice([a for a in cat.attributes if a not in base.attrs])
        swapped = [other_attr if a == goal["attributes"][0] else a for a in base.attrs]
        group, wanted = next(iter(goal["goal_options"].items()))
        others = [v for v in cat.options[group] if v != wanted]
        no_option = base.opts | {
            group: sorted(rng.sample(others, min(len(others), 3)), key=cat.options[group].index)
        }
        variants = (
            _Variant(cat, swapped, base.opts, base.price),
            _Variant(cat, base.attrs, no_option, base.price),
            _Variant(cat, base.attrs, base.opts, goal["price_upper"] + rng.choice([4.99, 14.99, 29.99])),
        )
        asins = []
        for variant in variants:
            asins.append(self.add(_brand(rng), variant))
            self._rebrand_while_satisfying(variant, goal)
        return asins

    def _rebrand_while_satisfying(self, variant: _Variant, goal: dict[str, Any]) -> None:
        """A brand name can spell a goal word that WebShop's reward finds in the title: draw the last
        item's brand again until the item no longer meets the goal."""
        redraws = 0
        while best_reward(self.last_product(), goal) >= 1.0:
            redraws += 1
            if redraws > 20:
                raise RuntimeError(f"a near-duplicate of {goal['asin']} keeps satisfying its goal")
            self.items[-1] = self._raw_item(self.items[-1]["asin"], _brand(self.rng), variant)


def make_goal(
    rng: random.Random, product: dict[str, Any], split: str, template: int | None = None
) -> dict[str, Any]:
    """A goal for a (normalised) product: 1-2 of its attributes, one value per option group, a price
    ceiling by WebShop's rule, written with one of the split's templates unless ``template`` is given."""
    cat = next(c for c in CATEGORIES if c.query == product["query"])
    goal_attrs = rng.sample(product["Attributes"], rng.randint(1, 2))
    options = {g: rng.choice(values) for g, values in product["options"].items()}
    price_upper = _price_upper(rng, product["pricing"][0])
    if template is None:
        held_out = split == "eval" and rng.random() < 0.5
        template = rng.choice(EVAL_ONLY_TEMPLATES if held_out else TRAIN_TEMPLATES)
    text = TEMPLATES[template].format(
        attrs=" and ".join(goal_attrs),
        noun=cat.noun,
        opts=" and ".join(options.values()) or "any style",
        opts_kv=", and ".join(f"{k}: {v}" for k, v in options.items()) or "any style",
        price=f"{price_upper:.2f}",
    )
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "product_category": product["product_category"],
        "instruction_text": text,
        "attributes": goal_attrs,
        "price_upper": price_upper,
        "goal_options": options,
        "template": template,
        "split": split,
    }


def goal_option_clicks(product: dict[str, Any], goal: dict[str, Any]) -> dict[str, str]:
    """The product's option choices that match the goal's option values (group -> value)."""
    wanted = {normalize_color(v.lower()) for v in goal["goal_options"].values()}
    chosen = {}
    for group, values in product["options"].items():
        for value in values:
            if value in wanted or normalize_color(value) in wanted:
                chosen[group] = value
                break
    return chosen


def best_reward(product: dict[str, Any], goal: dict[str, Any]) -> float:
    """The reward of buying ``product`` with the options that best fit ``goal``."""
    price = product["pricing"][0]
    return get_reward(product, goal, price, goal_option_clicks(product, goal))[0]


# ---- WebShop's load_products, for generated and real files alike ----------------------------------
def _parse_pricing(pricing: Any) -> tuple[list[float], str]:
    if isinstance(pricing, list):  # already normalised
        values = [float(p) for p in pricing] or [100.0]
    elif not pricing:
        values = [100.0]
    else:
        values = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in str(pricing).split("$")[1:]][:2]
    tag = f"${values[0]}" if len(values) == 1 else f"${values[0]} to ${values[1]}"
    return values, tag


def normalize_products(
    items: list[dict[str, Any]],
    attributes: dict[str, dict[str, Any]],
    reviews: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Raw WebShop records -> the product dicts the pages and the reward read (``load_products``)."""
    products: list[dict[str, Any]] = []
    seen: set[str] = set()
    for raw in items:
        asin = raw["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, price_tag = _parse_pricing(raw.get("pricing"))
        options: dict[str, list[str]] = {}
        for name, contents in (raw.get("customization_options") or {}).items():
            if contents:
                options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
        small = raw.get("small_description") or []
        review = (reviews or {}).get(asin, {})
        product_reviews = [
            {
                "title": r.get("title", ""),
                "score": r.get("score", r.get("stars", 0)),
                "body": r.get("body", r.get("review", "")),
            }
            for r in review.get("reviews", raw.get("reviews", []))
        ]
        record = attributes.get(asin, {})
        products.append(
            {
                "asin": asin,
                "name": raw["name"],
                "Title": raw["name"],
                "category": raw.get("category", ""),
                "query": str(raw.get("query", "")).lower().strip(),
                "product_category": raw.get("product_category", ""),
                "Description": raw.get("full_description") or "",
                "BulletPoints": small if isinstance(small, list) else [small],
                "Reviews": product_reviews,
                "Rating": review.get("average_rating", raw.get("average_rating", "N.A.")),
                "pricing": pricing,
                "Price": price_tag,
                "options": options,
                "Attributes": record.get("attributes") or ["DUMMY_ATTR"],
                "instruction_text": record.get("instruction"),
                "instruction_attributes": record.get("instruction_attributes"),
            }
        )
    return products


def product_prices(products: list[dict[str, Any]], seed: int = 0) -> dict[str, float]:
    """WebShop's ``generate_product_prices``: a price range is sampled once (seeded here)."""
    rng = random.Random(seed)
    prices = {}
    for p in products:
        lo = p["pricing"][0]
        prices[p["asin"]] = lo if len(p["pricing"]) == 1 else rng.uniform(lo, p["pricing"][1])
    return prices


# ---- real WebShop data ------------------------------------------------------------------------------
DATA_ENV_VAR = "WEBSHOP_DATA"


def _pick(folder: Path, pattern: str) -> Path | None:
    found = sorted(folder.glob(pattern), key=lambda p: (len(p.name), p.name))
    return found[0] if found else None


def load_real_webshop(folder: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Products and synthetic goals from a folder with WebShop's ``items_shuffle*.json`` and
    ``items_ins_v2*.json`` (``items_shuffle_1000.json`` is preferred over the full file when both are
    there, as the shortest name wins); ``items_human_ins.json`` adds human goals where present.

    Goals follow WebShop's ``get_synthetic_goals`` / ``get_human_goals`` (one goal per option
    combination) and are shuffled with WebShop's seed 233.
    """
    folder = Path(folder)
    items_path, ins_path = _pick(folder, "items_shuffle*.json"), _pick(folder, "items_ins_v2*.json")
    if items_path is None or ins_path is None:
        raise FileNotFoundError(
            f"{folder} needs items_shuffle*.json and items_ins_v2*.json from WebShop's data download "
            f"(see github.com/princeton-nlp/WebShop, setup.sh); set {DATA_ENV_VAR} to that folder"
        )
    items = json.loads(items_path.read_text())
    attributes = json.loads(ins_path.read_text())
    human_path = folder / "items_human_ins.json"
    human = json.loads(human_path.read_text()) if human_path.exists() else {}
    products = normalize_products(items, attributes)
    prices = product_prices(products)
    rng = random.Random(233)
    goals: list[dict[str, Any]] = []
    for p in products:
        for instruction in human.get(p["asin"], []):
            if instruction.get("instruction_attributes"):
                goals.append(
                    _real_goal(
                        rng,
                        p,
                        prices,
                        instruction["instruction"].strip("."),
                        instruction["instruction_attributes"],
                        dict(enumerate(instruction.get("instruction_options", []))),
                    )
                )
        if human or not p["instruction_text"] or not p["instruction_attributes"]:
            continue
        combos: list[dict[str, str]] = [{}]
        for name in sorted(p["options"]):
            combos = [c | {name: v} for c in combos for v in p["options"][name]]
        for combo in combos:
            text = ", and ".join(f"{k}: {v}" for k, v in combo.items())
            goals.append(
                _real_goal(
                    rng,
                    p,
                    prices,
                    p["instruction_text"] + (f" with {text}" if text else ""),
                    p["instruction_attributes"],
                    combo,
                )
            )
    random.Random(233).shuffle(goals)
    return products, goals


def _real_goal(rng, product, prices, text: str, attrs: list[str], options: dict) -> dict[str, Any]:
    above = [p for p in PRICE_RANGE if p > prices[product["asin"]]][:4]
    if len(above) >= 2:
        price_upper = sorted(rng.sample(above, 2))[1]
        text += f", and price lower than {price_upper:.2f} dollars"
    else:
        price_upper = 1000000.0
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "product_category": product["product_category"],
        "instruction_text": text,
        "attributes": attrs,
        "price_upper": price_upper,
        "goal_options": {str(k): v for k, v in options.items()},
    }
