"""What the dashboard plots: which metric keys go on which panel, how long series are thinned, how runs
are grouped into mean ± band, and the numbers of the summary and evaluation tables. Pure functions.

Metric rows hold flat ``values`` dicts with the trainer's names (trainer/loop.py, trainer/evaluate.py):
train rows ``train/success``, ``train/guided/success``, ``train/free/reward`` (per env of a mixture
``train/<env>/success``, ``train/guided/<env>/success``), ``actor/loss``,
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

from django.urls import reverse

from trainer.experiments.stats import t_interval

MAX_POINTS = 1000
"""Most points per series sent to a browser: long runs are thinned to one row per bucket of steps."""
MAX_SERIES = 6
"""Series drawn per panel at first; the legend shows the rest, a click on one draws it."""
SMOOTH_MIN_POINTS = 10
"""Smoothing never applies to a series with fewer points than this: a short run's curve is its values."""

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
    section: str = ""
    """The folded section it belongs to; '' for the short default set that answers "is it learning?"."""


ACTOR, EVALUATION, EXPERIENCE, ROLLOUT, OTHER = (
    "Actor",
    "Evaluation",
    "Experience bank and extractor",
    "Rollout and engine",
    "Other",
)
PANELS: tuple[Panel, ...] = (
    # the default set, always open
    Panel(
        "success",
        "Success: all, with experience (guided), without (free)",
        "train",
        r"(train/)?(\S+/)?success.*",
    ),
    Panel("eval-success", "Eval success with / without experience", "eval", r"(eval/)?(\S+/)?success.*"),
    Panel("reward", "Reward by subgroup", "train", r"(train/)?(\S+/)?reward.*"),
    Panel("bank-size", "Bank size", "train", r"bank/size|\w+/bank_size"),
    Panel("time", "Step time", "train", r"time[/_].*"),
    # folded, by subsystem
    Panel("actor", "Actor loss, clip fraction, advantages", "train", r"(actor|adv)[/_].*", ACTOR),
    Panel(
        "actions",
        "Actions, invalid actions, truncation",
        "train",
        r"(train/)?(\S+/)?(actions|invalid|truncated|episodes).*",
        ACTOR,
    ),
    Panel(
        "eval-actions",
        "Eval actions with / without experience",
        "eval",
        r"(eval/)?(\S+/)?actions.*",
        EVALUATION,
    ),
    Panel("eval-other", "Other eval", "eval", "", EVALUATION),
    Panel(
        "retrieval",
        "Retrieval and Search-and-Ask latency",
        "train",
        r".*(retriev|search_and_ask).*_(s|ms)",
        EXPERIENCE,
    ),
    Panel("bank", "Bank and experience use", "train", r"(bank|experience)[/_].*", EXPERIENCE),
    Panel("extractor", "Extractor loss and clip fraction", "train", r"extractor[/_].*", EXPERIENCE),
    Panel("ops", "Operation mix", "train", r"(\w+/)?ops[/_].*", EXPERIENCE),
    Panel("parse", "Parse failures", "train", r".*parse.*", EXPERIENCE),
    Panel("rollout", "Rollout throughput and engine", "train", r"(rollout|engine)[/_].*", ROLLOUT),
    Panel("other", "Other metrics", "train", "", OTHER),
)
_COMPILED = [(p, re.compile(p.pattern) if p.pattern else None) for p in PANELS]

LEADING_KEYS = (
    "train/success", "train/guided/success", "train/free/success",
    "eval/success", "eval/with_exp/success",
    "train/reward", "train/guided/reward", "train/free/reward",
    "bank/size", "experience/bank_size",
    "time/step_s", "time/rollout_s", "time/backward_s",
    "actor/loss", "actor/clip_frac", "extractor/loss", "extractor/clip_frac",
    "eval/actions", "eval/with_exp/actions",
)  # fmt: skip
"""Keys a panel lists (and draws) first, in this order; the rest follow, shallowest names first."""
COMPARE_DEFAULT = (
    "train/success", "train/guided/success", "train/free/success", "eval/success", "eval/with_exp/success",
    "train/reward", "bank/size", "experience/bank_size", "time/step_s",
)  # fmt: skip
"""The metrics a comparison shows until a person picks others: the short "is it learning?" set."""


def chart_options() -> dict[str, Any]:
    """What the browser needs to place and draw keys as this module does (charts.js)."""
    return {"leading": LEADING_KEYS, "max_series": MAX_SERIES, "smooth_min_points": SMOOTH_MIN_POINTS}


def key_order(key: str) -> tuple[int, int, str]:
    """Sort key of a metric within its panel: the leading keys, then by depth, then by name."""
    rank = LEADING_KEYS.index(key) if key in LEADING_KEYS else len(LEADING_KEYS)
    return rank, key.count("/"), key


def catalogue() -> list[dict[str, Any]]:
    """Every panel with its pattern, catch-alls last: browsers place keys that first appear live with it."""
    return [
        {"id": p.id, "title": p.title, "kind": p.kind, "pattern": p.pattern, "section": p.section}
        for p in PANELS
    ]


def panel_of(kind: str, key: str) -> Panel:
    for panel, regex in _COMPILED:
        if panel.kind == kind and (regex is None or regex.fullmatch(key)):
            return panel
    raise AssertionError("every kind has a catch-all panel")


def panels_for(keys: Mapping[str, Iterable[str]]) -> list[dict[str, Any]]:
    """The panels to draw for the keys present per kind, in catalogue order, each panel's keys in
    ``key_order``: ``[{id, title, kind, section, keys}]``."""
    chosen: dict[str, dict[str, Any]] = {}
    for kind, kind_keys in keys.items():
        for key in kind_keys:
            panel = panel_of(kind, key)
            entry = {"id": panel.id, "title": panel.title, "kind": kind, "section": panel.section, "keys": []}
            chosen.setdefault(panel.id, entry)["keys"].append(key)
    for panel in chosen.values():
        panel["keys"].sort(key=key_order)
    order = [p.id for p in PANELS]
    return sorted(chosen.values(), key=lambda p: order.index(p["id"]))


def default_metrics(metrics: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The comparison's starting set among ``(kind, key)`` metrics present: ``COMPARE_DEFAULT`` in its order
    (or, for runs that have none of it, the first few)."""
    present = set(metrics)
    short = [(kind_of(key), key) for key in COMPARE_DEFAULT if (kind_of(key), key) in present]
    return short or list(metrics[:MAX_SERIES])


def kind_of(key: str) -> str:
    """The metric kind a trainer key is recorded under: eval keys start with ``eval/``."""
    return "eval" if key.startswith("eval/") else "train"


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


def smooth(values: Sequence[float | None], weight: float) -> list[float | None]:
    """What a panel draws for a smoothing weight: the values themselves at weight 0 or with fewer than
    ``SMOOTH_MIN_POINTS`` points (a short run is shown as it is), else their ``ema``. Mirrors charts.js."""
    if weight <= 0 or sum(v is not None for v in values) < SMOOTH_MIN_POINTS:
        return list(values)
    return ema(values, weight)


def mean_band(
    series: Sequence[Mapping[int, float | None]],
) -> tuple[list[int], list[float | None], list[float | None], list[float | None]]:
    """Align runs (seeds) by step: (steps, mean, low, high), the 95% Student-t interval of the mean over the
    runs present at each step, as the experiment reports give it; low and high are None with one run."""
    steps = sorted(set().union(*[s.keys() for s in series])) if series else []
    mean, lo, hi = [], [], []
    for step in steps:
        xs = [s[step] for s in series if step in s and s[step] is not None]
        band = t_interval(xs)
        mean.append(band.mean if xs else None)
        lo.append(band.low if band.n > 1 else None)
        hi.append(band.high if band.n > 1 else None)
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
    """``{kind, key, panel, section, selected}`` for every metric any run has, in panel order (the picker)."""
    selected: list[dict[str, str]]
    """``{kind, key}`` of the metrics drawn as small multiples (``default_metrics`` unless picked)."""
    summary: list[dict[str, Any]]
    """Per metric: ``{kind, key, cells: [(final, best) per run]}``."""
    eval_table: dict[str, Any]
    """The paper's Table 1 layout: ``{envs, rows: [{name, cells: [(with, without) per env]}]}``."""
    diff: list[tuple[str, list[Any]]]

    def chart_data(self) -> dict[str, Any]:
        return {"runs": self.runs, "groups": self.groups, "metrics": self.metrics, **chart_options()}

    def csv_rows(self, *, every_metric: bool = False) -> list[list[Any]]:
        """The plotted points of the metrics the page draws (``selected``), or of all of them."""
        shown = {(m["kind"], m["key"]) for m in self.selected}
        rows = []
        for run in self.runs:
            for kind, s in run["series"].items():
                for key, values in s["values"].items():
                    if not every_metric and (kind, key) not in shown:
                        continue
                    for step, wall, value in zip(s["step"], s["wall"], values, strict=True):
                        if value is not None:
                            rows.append([run["id"], run["name"], run["group"], kind, key, step, wall, value])
        return rows


def default_group(runs: Sequence[Any]) -> str:
    """'seeds' when two of the runs are seeds of one arm of an experiment (their mean and 95% band say more
    than their lines), else '' (one line per run)."""
    arms = [(r.experiment_id, r.cell.rsplit("/s", 1)[0]) for r in runs if r.experiment_id and r.cell]
    return "seeds" if len(arms) != len(set(arms)) else ""


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


def _picker_entries(
    metrics: Sequence[tuple[str, str]], selected: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """The metrics as the picker lists them: by panel in catalogue order, each panel's keys in order."""
    panels = panels_for({kind: [k for m, k in metrics if m == kind] for kind in ("train", "eval")})
    return [
        {"kind": p["kind"], "key": key, "panel": p["title"], "section": p["section"] or "Is it learning?",
         "selected": (p["kind"], key) in selected}
        for p in panels
        for key in p["keys"]
    ]  # fmt: skip


def build_comparison(
    runs: Sequence[Any],
    series: Mapping[int, Mapping[str, Any]],
    *,
    group: str = "",
    picked: Sequence[tuple[str, str]] = (),
) -> Comparison:
    """Everything the compare page shows, from the runs and their (equally bucketed) ``Series``; ``picked``
    ``(kind, key)`` metrics are drawn (those the runs have), else the short default set."""
    labels = _group_labels(runs, group)
    order = list(dict.fromkeys(labels))
    out_runs = []
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        out_runs.append({
            "id": run.id, "name": run.name, "method": run.method, "env": run.env, "seed": run.seed,
            "url": getattr(run, "url", "") or reverse("run_detail", args=[run.id]),
            "committed": getattr(run, "committed", False),
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
    selected = [m for m in picked if m in set(metrics)] or default_metrics(metrics)
    return Comparison(
        runs=out_runs,
        groups=groups,
        metrics=_picker_entries(metrics, selected),
        selected=[{"kind": k, "key": key} for k, key in selected],
        summary=summary,
        eval_table=_eval_table(out_runs),
        diff=config_diff([r.config for r in runs]),
    )
