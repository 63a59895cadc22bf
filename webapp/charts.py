"""What the dashboard plots: which metric keys go on which panel, how long series are thinned, how runs
are grouped into mean ± band, and the numbers of the summary and evaluation tables. Pure functions.

Metric rows hold flat ``values`` dicts with the trainer's names (trainer/loop.py, trainer/evaluate.py):
train rows ``train/success``, ``train/guided/success``, ``train/free/reward``, ``actor/loss``,
``actor/clip_frac``, ``extractor/...``, ``experience/retrieve_s``, ``time/rollout_s``, ...; eval rows
``eval/success`` (without experience), ``eval/with_exp/success`` (with it), per environment of a mixture
``eval/<env>/success`` and ``eval/with_exp/<env>/success``, and the same for ``actions``. Panels pick keys by
pattern, so a new key lands on a fitting panel without touching this file, and any key no panel claims is
still drawn, under "Other".
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_POINTS = 1000
"""Most points per series sent to a browser: long runs are thinned to one row per bucket of steps."""

WITH_EXP = "with_exp/"
"""Eval keys with this segment are the with-experience column (``trainer.evaluate.WITH_EXP``)."""


@dataclass(frozen=True)
class Panel:
    id: str
    title: str
    kind: str
    """'train' or 'eval': which metric rows it plots."""
    pattern: str
    """A regular expression (Python and JavaScript alike) a key must match in full; '' matches any key."""


PANELS: tuple[Panel, ...] = (
    Panel(
        "success",
        "Success: all, with experience (guided), without (free)",
        "train",
        r"(train/)?(\w+/)?success.*",
    ),
    Panel("reward", "Reward by subgroup", "train", r"(train/)?(\w+/)?reward.*"),
    Panel("eval-success", "Eval success with / without experience", "eval", r"(eval/)?(\S+/)?success.*"),
    Panel("eval-actions", "Eval actions with / without experience", "eval", r"(eval/)?(\S+/)?actions.*"),
    Panel("actor", "Actor loss, clip fraction, advantages", "train", r"(actor|adv)[/_].*"),
    Panel("extractor", "Extractor loss and clip fraction", "train", r"extractor[/_].*"),
    Panel(
        "retrieval", "Retrieval and Search-and-Ask latency", "train", r".*(retriev|search_and_ask).*_(s|ms)"
    ),
    Panel("bank", "Bank size and experience use", "train", r"(bank|experience)[/_].*"),
    Panel("ops", "Operation mix", "train", r"(\w+/)?ops[/_].*"),
    Panel("parse", "Parse failures", "train", r".*parse.*"),
    Panel("time", "Step time breakdown", "train", r"time[/_].*"),
    Panel(
        "actions",
        "Actions, invalid actions, truncation",
        "train",
        r"(train/)?(\w+/)?(actions|invalid|truncated).*",
    ),
    Panel("other", "Other metrics", "train", ""),
    Panel("eval-other", "Other eval", "eval", ""),
)
_COMPILED = [(p, re.compile(p.pattern) if p.pattern else None) for p in PANELS]


def catalogue() -> list[dict[str, Any]]:
    """Every panel with its pattern, catch-alls last: browsers place keys that first appear live with it."""
    return [{"id": p.id, "title": p.title, "kind": p.kind, "pattern": p.pattern} for p in PANELS]


def panel_of(kind: str, key: str) -> Panel:
    for panel, regex in _COMPILED:
        if panel.kind == kind and (regex is None or regex.fullmatch(key)):
            return panel
    raise AssertionError("every kind has a catch-all panel")


def panels_for(keys: Mapping[str, Iterable[str]]) -> list[dict[str, Any]]:
    """The panels to draw for the keys present per kind, in catalogue order: ``[{id, title, kind, keys}]``."""
    chosen: dict[str, dict[str, Any]] = {}
    for kind, kind_keys in keys.items():
        for key in sorted(kind_keys):
            panel = panel_of(kind, key)
            chosen.setdefault(panel.id, {"id": panel.id, "title": panel.title, "kind": kind, "keys": []})
            chosen[panel.id]["keys"].append(key)
    order = [p.id for p in PANELS]
    return sorted(chosen.values(), key=lambda p: order.index(p["id"]))


def bucket_size(max_step: int, max_points: int = MAX_POINTS) -> int:
    """Steps per bucket so that steps 0..max_step give at most ``max_points`` buckets."""
    return max(1, math.ceil((max_step + 1) / max_points))


def lower_is_better(key: str) -> bool:
    """Losses, durations, latencies, failures, invalid actions and action counts: the best is the smallest."""
    words = ("loss", "latency", "fail", "invalid", "truncated", "actions")
    return any(w in key for w in words) or key.startswith("time") or key.endswith(("_s", "_ms"))


def final_and_best(values: Sequence[float | None], key: str) -> tuple[float | None, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    return present[-1], (min if lower_is_better(key) else max)(present)


def ema(values: Sequence[float | None], weight: float) -> list[float | None]:
    """TensorBoard-style exponential smoothing with debiasing; gaps stay gaps. Mirrors charts.js."""
    out: list[float | None] = []
    last, n = 0.0, 0
    for v in values:
        if v is None:
            out.append(None)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight**n) if weight > 0 else v)
    return out


def mean_band(
    series: Sequence[Mapping[int, float | None]],
) -> tuple[list[int], list[float | None], list[float | None], list[float | None]]:
    """Align runs by step: (steps, mean, mean - std, mean + std) over the runs present at each step."""
    steps = sorted(set().union(*[s.keys() for s in series])) if series else []
    mean, lo, hi = [], [], []
    for step in steps:
        xs = [s[step] for s in series if step in s and s[step] is not None]
        if not xs:
            mean.append(None), lo.append(None), hi.append(None)
            continue
        m = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
        mean.append(m), lo.append(m - sd), hi.append(m + sd)
    return steps, mean, lo, hi


def histogram(values: Sequence[float], bins: int = 10) -> list[dict[str, float]]:
    """Equal-width bins over the values' range: ``[{lo, hi, count, frac}]`` (frac of the tallest bin)."""
    if not values:
        return []
    low, high = min(values), max(values)
    if low == high:
        return [{"lo": low, "hi": high, "count": len(values), "frac": 1.0}]
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - low) / width), bins - 1)] += 1
    top = max(counts)
    return [
        {"lo": low + i * width, "hi": low + (i + 1) * width, "count": c, "frac": c / top}
        for i, c in enumerate(counts)
    ]


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as dotted keys: ``{"actor": {"lr": 1e-5}}`` -> ``{"actor.lr": 1e-5}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_diff(configs: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Any]]]:
    """Dotted keys whose values differ between the configs, with each config's value (None if missing)."""
    flat = [flatten(c) for c in configs]
    keys = sorted(set().union(*[f.keys() for f in flat])) if flat else []
    rows = []
    for key in keys:
        values = [f.get(key) for f in flat]
        if any(v != values[0] for v in values[1:]):
            rows.append((key, values))
    return rows


# ---- comparison ----------------------------------------------------------------------------------

PALETTE = ("#2f6fed", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285", "#e67700", "#5c940d", "#364fc7")


def colour(i: int) -> str:
    """The i-th colour: runs (or groups) keep their colour on every panel of a comparison."""
    return PALETTE[i % len(PALETTE)]


@dataclass
class Comparison:
    runs: list[dict[str, Any]]
    """``{id, name, method, env, seed, group, colour, series: {kind: {step, wall, values}}}``"""
    groups: list[dict[str, Any]]
    """``{label, colour, runs, series: {kind: {key: {step, wall, mean, lo, hi}}}}`` (empty when ungrouped)"""
    metrics: list[dict[str, str]]
    """``{kind, key}`` for every metric any run has."""
    summary: list[dict[str, Any]]
    """Per metric: ``{kind, key, cells: [(final, best) per run]}``."""
    eval_table: dict[str, Any]
    """The paper's Table 1 layout: ``{envs, rows: [{name, cells: [(with, without) per env]}]}``."""
    diff: list[tuple[str, list[Any]]]

    def chart_data(self) -> dict[str, Any]:
        return {"runs": self.runs, "groups": self.groups, "metrics": self.metrics}

    def csv_rows(self) -> list[list[Any]]:
        rows = []
        for run in self.runs:
            for kind, s in run["series"].items():
                for key, values in s["values"].items():
                    for step, wall, value in zip(s["step"], s["wall"], values, strict=True):
                        if value is not None:
                            rows.append([run["id"], run["name"], run["group"], kind, key, step, wall, value])
        return rows


def _group_labels(runs: Sequence[Any], group: str) -> list[str]:
    if not group:
        return ["" for _ in runs]
    if group == "seeds":
        differing = [k for k, _ in config_diff([r.config for r in runs]) if k != "seed"]
        flat = [flatten(r.config) for r in runs]
        return [", ".join(f"{k}={f.get(k)}" for k in differing) or "all runs" for f in flat]
    return [f"{group}={flatten(r.config).get(group)}" for r in runs]


def _eval_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Final eval success with and without experience, per environment of a mixture and on average, and
    the mean actions: the paper's Table 1 layout (``eval/<env>/success`` without, ``eval/with_exp/...`` with).
    """
    envs: list[str] = []
    finals = []
    for run in runs:
        values = run["series"]["eval"]["values"]
        final = {k: final_and_best(v, k)[0] for k, v in values.items()}
        finals.append(final)
        for key in final:
            m = re.fullmatch(r"eval/(?!with_exp/)(\S+)/success", key)
            if m and m.group(1) not in envs:
                envs.append(m.group(1))
    columns = [*[f"{env}/success" for env in envs], "success", "actions"]
    rows = []
    for run, final in zip(runs, finals, strict=True):
        cells = [(final.get(f"eval/{WITH_EXP}{c}"), final.get(f"eval/{c}")) for c in columns]
        rows.append({"name": run["name"], "colour": run["colour"], "cells": cells})
    return {"envs": [*envs, "average success", "mean actions"], "rows": rows}


def build_comparison(
    runs: Sequence[Any], series: Mapping[int, Mapping[str, Any]], *, group: str = ""
) -> Comparison:
    """Everything the compare page shows, from the runs and their (equally bucketed) ``Series``."""
    labels = _group_labels(runs, group)
    order = list(dict.fromkeys(labels))
    out_runs = []
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        out_runs.append({
            "id": run.id, "name": run.name, "method": run.method, "env": run.env, "seed": run.seed,
            "group": label, "colour": colour(order.index(label) if group else i),
            "series": {kind: s.as_json() for kind, s in series[run.id].items()},
        })  # fmt: skip
    metrics = sorted(
        {(kind, key) for r in out_runs for kind, s in r["series"].items() for key in s["values"]}
    )
    groups = []
    if group:
        for label in order:
            members = [r for r in out_runs if r["group"] == label]
            grouped: dict[str, dict[str, Any]] = {"train": {}, "eval": {}}
            for kind, key in metrics:
                by_step, walls = [], defaultdict(list)
                for r in members:
                    s = r["series"][kind]
                    points = dict(zip(s["step"], s["values"].get(key, [None] * len(s["step"])), strict=True))
                    by_step.append(points)
                    for step, wall in zip(s["step"], s["wall"], strict=True):
                        walls[step].append(wall)
                steps, mean, lo, hi = mean_band(by_step)
                wall = [sum(walls[s]) / len(walls[s]) for s in steps]
                grouped[kind][key] = {"step": steps, "wall": wall, "mean": mean, "lo": lo, "hi": hi}
            members_ids = [r["id"] for r in members]
            groups.append(
                {"label": label, "colour": colour(order.index(label)), "runs": members_ids, "series": grouped}
            )
    summary = []
    for kind, key in metrics:
        cells = [final_and_best(r["series"][kind]["values"].get(key, []), key) for r in out_runs]
        summary.append({"kind": kind, "key": key, "cells": cells})
    return Comparison(
        runs=out_runs,
        groups=groups,
        metrics=[{"kind": k, "key": key} for k, key in metrics],
        summary=summary,
        eval_table=_eval_table(out_runs),
        diff=config_diff([r.config for r in runs]),
    )
