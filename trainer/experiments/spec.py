"""An experiment: one base config, methods (and variants) × seeds, one shared budget (issue 13).

A file in ``configs/experiments/`` (TOML or JSON)::

    name = "room-random"
    description = "GRPO vs Complementary RL on MiniHack-Room-Random-5x5"
    base = "../cpu-room-random-grpo.toml"   # a preset name or a config file (relative to this file)
    set = { env = "MiniHack-Room-5x5" }      # optional: changes to the base, for every cell
    methods = ["grpo", "complementary"]
    seeds = [0, 1, 2]

    [budget]            # the same for every cell: steps, tasks, K, evaluation schedule and size
    steps = 20
    eval_every = 10

    [[variants]]        # optional cells beyond methods × seeds, each run for every seed
    name = "static_online+curated"
    method = "static_online"
    bank = "room-curated.jsonl"    # the bank starts from these entries (relative to this file)
    set = { "experience.warmup_steps" = 0 }

Every cell's config is the base, then the budget, then the method and seed, then the variant's ``set``.
A variant may not change a budget key: every arm spends the same budget.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import METHODS, ConfigError, RunConfig, get_preset

BUDGET_KEYS = (
    "steps",
    "tasks_per_step",
    "k_rollouts",
    "eval_every",
    "eval_episodes",
    "checkpoint_every",
    "checkpoint_keep",
    "rollout.turn_limit",
    "rollout.max_new_tokens",
)
"""Keys a budget may set; any other knob belongs to the base config (it is the same for every cell then)."""
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,79}$")
"""An experiment's name: a URL slug and a folder name."""
ARM = re.compile(r"^[a-z0-9][a-z0-9_.+-]{0,79}$")
TOP_KEYS = {"name", "description", "base", "set", "methods", "seeds", "budget", "variants"}


@dataclass(frozen=True)
class Variant:
    """An extra arm: a method with config changes and/or a starting bank."""

    name: str
    method: str
    overrides: dict[str, Any] = field(default_factory=dict)
    bank: Path | None = None


@dataclass(frozen=True)
class Cell:
    """One run of the grid: an arm (a method or a variant) at one seed."""

    arm: str
    seed: int
    config: RunConfig
    bank: Path | None = None

    @property
    def key(self) -> str:
        """Unique within the experiment, stable across machines: ``grpo/s0``."""
        return f"{self.arm}/s{self.seed}"

    @property
    def slug(self) -> str:
        """The key as a folder name: ``grpo-s0``."""
        return self.key.replace("/", "-")


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    description: str
    base: RunConfig
    budget: dict[str, Any]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    variants: tuple[Variant, ...] = ()
    source: Path | None = None

    @property
    def arms(self) -> list[str]:
        return list(self.methods) + [v.name for v in self.variants]

    def cells(self) -> list[Cell]:
        """Every run of the grid, seed by seed and arm by arm within a seed (the order they are queued in:
        a grid cut short still has every arm at its first seeds)."""
        arms = [(m, m, {}, None) for m in self.methods]
        arms += [(v.name, v.method, v.overrides, v.bank) for v in self.variants]
        out = []
        for seed in self.seeds:
            for arm, method, overrides, bank in arms:
                try:
                    cfg = self.base.with_overrides(**self.budget, method=method, seed=seed, **overrides)
                except ConfigError as err:
                    raise ConfigError(f"experiment {self.name!r}, cell {arm}/s{seed}: {err}") from None
                out.append(Cell(arm, seed, cfg, bank))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: what the database stores for the experiment."""
        return {
            "name": self.name,
            "description": self.description,
            "base": self.base.to_dict(),
            "budget": self.budget,
            "methods": list(self.methods),
            "seeds": list(self.seeds),
            "variants": [
                {"name": v.name, "method": v.method, "set": v.overrides, "bank": str(v.bank or "")}
                for v in self.variants
            ],
            "source": str(self.source or ""),
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> ExperimentSpec:
        """The grid as ``to_dict`` stored it, for reading its cells' keys and configs: the files it named
        (its source, the variants' starting banks) need not exist here, so its cells carry no bank."""
        stored = {k: v for k, v in data.items() if k != "source"}
        stored["variants"] = [{**v, "bank": ""} for v in data.get("variants") or ()]
        return cls.from_dict(stored)

    @classmethod
    def from_file(cls, path: str | Path) -> ExperimentSpec:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"no experiment file {path}")
        try:
            data = json.loads(path.read_text()) if path.suffix == ".json" else tomllib.loads(path.read_text())
        except (ValueError, tomllib.TOMLDecodeError) as err:
            raise ConfigError(f"experiment file {path} cannot be read: {err}") from None
        return cls.from_dict(data, folder=path.parent, source=path)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, folder: Path | None = None, source: Path | None = None
    ) -> ExperimentSpec:
        unknown = set(data) - TOP_KEYS
        _require(not unknown, f"unknown experiment keys {sorted(unknown)} (known: {sorted(TOP_KEYS)})")
        name = str(data.get("name", ""))
        _require(bool(NAME.match(name)), f"name must be lower-case letters, digits, - and _ (got {name!r})")
        base = _base_config(data.get("base", "cpu"), folder)
        shared = dict(data.get("set") or {})
        _require(not {"method", "seed"} & set(shared), "set may not name method or seed: the grid does")
        base = base.with_overrides(**shared) if shared else base
        budget = dict(data.get("budget") or {})
        bad = sorted(set(budget) - set(BUDGET_KEYS))
        _require(not bad, f"budget keys {bad} are not budget (budget keys: {', '.join(BUDGET_KEYS)})")
        methods = tuple(str(m) for m in data.get("methods") or ())
        for m in methods:
            _require(m in METHODS, f"method {m!r} is not one of {', '.join(METHODS)}")
        _require(len(set(methods)) == len(methods), "methods repeat")
        seeds = tuple(data.get("seeds") or (0,))
        _require(
            all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
            and len(set(seeds)) == len(seeds),
            f"seeds must be distinct whole numbers from 0 (got {list(seeds)})",
        )
        variants = tuple(_variant(v, folder, budget) for v in data.get("variants") or ())
        arms = list(methods) + [v.name for v in variants]
        _require(bool(arms), "an experiment needs at least one method or variant")
        _require(len(set(arms)) == len(arms), f"arm names repeat: {arms}")
        spec = cls(name, str(data.get("description", "")), base, budget, methods, seeds, variants, source)
        spec.cells()  # every cell's config must be valid now, not when its turn comes
        return spec


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(f"experiment: {message}")


def _base_config(base: Any, folder: Path | None) -> RunConfig:
    if isinstance(base, Mapping):
        return RunConfig.from_dict(base)
    base = str(base)
    if base.endswith((".toml", ".json")):
        path = (folder or Path()) / base
        _require(path.exists(), f"base config {path} does not exist")
        return RunConfig.from_file(path)
    return get_preset(base)


def _variant(data: Any, folder: Path | None, budget: Mapping[str, Any]) -> Variant:
    _require(isinstance(data, Mapping), f"a variant must be a table (got {data!r})")
    unknown = set(data) - {"name", "method", "set", "bank"}
    _require(not unknown, f"unknown variant keys {sorted(unknown)} (known: name, method, set, bank)")
    name, method = str(data.get("name", "")), str(data.get("method", ""))
    _require(bool(ARM.match(name)), f"variant name must be lower-case letters, digits, -_.+ (got {name!r})")
    _require(method in METHODS, f"variant {name!r}: method {method!r} is not one of {', '.join(METHODS)}")
    overrides = dict(data.get("set") or {})
    clash = sorted(k for k in overrides if k in budget or k in ("method", "seed"))
    _require(not clash, f"variant {name!r} may not set {clash}: every arm spends the same budget")
    bank = None
    if data.get("bank"):
        bank = (folder or Path()) / str(data["bank"])
        _require(bank.exists(), f"variant {name!r}: bank file {bank} does not exist")
        _require(method != "grpo", f"variant {name!r}: grpo uses no bank")
    return Variant(name, method, overrides, bank)
