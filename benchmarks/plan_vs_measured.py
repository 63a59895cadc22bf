"""The plan's step time against the step times committed runs measured, per config: before (the plan alone)
and after the correction a worker applies from its own runs (``webapp.workers.measured_pace``: the plan
times the median ratio measured / planned of the worker's newest runs, those of the same env and method
when it has some): here from the other configs' cells, and from the same config's other seeds
(leave-one-out). Nothing trains: it reads the committed cells under ``docs/experiments/``.

    .venv/bin/python benchmarks/plan_vs_measured.py

Writes ``docs/benchmarks/results/plan-vs-measured.json`` (``benchmarks.outputs``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # also runnable as a plain script
from benchmarks.outputs import write_output  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.plan import Devices, plan_run  # noqa: E402
from trainer.runfiles import read_lines  # noqa: E402

BOX = Devices.parse("cpu:24GB")
"""The machine the committed cells trained on (2 cores, 24 GB)."""


def cells() -> list[dict]:
    """Each committed cell with its config, its measured median step time and the plan's."""
    out = []
    records = sorted((ROOT / "docs" / "experiments").glob("**/cell.json"))
    for record in records:
        folder = record.parent
        steps = [r["time/step_s"] for r in read_lines(folder / "metrics.jsonl") if r.get("kind") == "step"
                 and isinstance(r.get("time/step_s"), int | float)]  # fmt: skip
        if len(steps) < 5:
            continue
        cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
        label = f"{cfg.method}{' LoRA' if cfg.actor.lora.enabled else ''} on {cfg.env}"
        out.append({"cell": str(folder.relative_to(ROOT / "docs" / "experiments")), "config": label,
                    "measured_s": statistics.median(steps),
                    "planned_s": plan_run(cfg, BOX).step_s})  # fmt: skip
    return out


def _corrected(cell: dict, others: list[dict]) -> float | None:
    """The plan of ``cell`` times the median ratio measured / planned of ``others`` (None without any)."""
    ratios = [c["measured_s"] / c["planned_s"] for c in others if c is not cell]
    return cell["planned_s"] * statistics.median(ratios) if ratios else None


def main() -> None:
    found = cells()
    rows = []
    for config in dict.fromkeys(c["config"] for c in found):
        mine = [c for c in found if c["config"] == config]
        elsewhere = [c for c in found if c["config"] != config]
        same = [_corrected(c, mine) for c in mine]
        rows.append({
            "config": config, "cells": len(mine),
            "measured step (s)": round(statistics.median(c["measured_s"] for c in mine), 1),
            "plan / measured": round(statistics.median(c["planned_s"] / c["measured_s"] for c in mine), 2),
            "other configs' pace / measured": round(
                statistics.median(_corrected(c, elsewhere) / c["measured_s"] for c in mine), 2),
            "same config's other seeds / measured": round(statistics.median(
                s / c["measured_s"] for s, c in zip(same, mine, strict=True)), 2) if len(mine) > 1 else None,
        })  # fmt: skip
        print(rows[-1])
    write_output("plan-vs-measured", {"rows": rows, "devices": BOX.describe()})


if __name__ == "__main__":
    main()
