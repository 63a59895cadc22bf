"""An experiment's report from its result files alone (no database): report.md, PNG plots, summary.csv and
summary.md (the generated block in docs/results.md, ``trainer.experiments.summary``).

    python -m trainer.experiments.report docs/experiments/room-random     # or: manage.py experiment report

Reads ``<folder>/runs/<cell>/`` as ``webapp.experiments.export_results`` writes them: ``cell.json``,
``config.json``, ``metrics.jsonl``, ``episodes.jsonl``, ``changes.jsonl``, ``merges.jsonl``,
``extractor_failures.jsonl`` (refusing a folder that holds two attempts of a row), and the hand labels
``<folder>/labels.jsonl``. Sections:

0. conditions and time: each cell's commit, CPU and versions, flags where an arm's cells differ, and its
   wall time split into training, interruptions and the extractor's tail (``trainer.experiments.conditions``);
1. eval success (with and without experience) vs step per arm: mean over seeds with a 95% t-band, each
   run's point with its Wilson interval over its eval episodes; area under the curve; steps to 50% / 75%;
2. the paper's Table 1 layout (per env and average, with/without experience) as mean ± 95% CI, and the
   differences: each arm minus the first (Welch), with minus without experience (paired per run);
3. what the experience did: guided vs free training success; per entry, success when retrieved minus the
   free rollouts' success on the same task instances (usefulness); guided rollouts beside the grpo run's
   rollouts of the same sampling seed while both actors are untrained; each merge pass's effect; the
   similarity of what was handed out; the bank as it was (``trainer.experiments.bank``), checked against
   the run's ``bank/size``, its hand-labelled quality and the mechanical rule's precision against it;
4. what the extractor did: CISPO steps, buffer fill, mean |advantage|, clip fraction, job counts from the
   journals (merge passes and attempts, unusable answers, applied operations), Search-and-Ask use;
5. cost: training time per phase (never wall time), the extractor's generated tokens beside the actor's.

One module per section: ``cost`` (0 and 5), ``evaluation`` (1 and 2), ``experience``, ``same_slot``,
``merges`` and ``quality`` (3), ``extractor`` (4); ``runs`` reads the result files back, ``render`` writes
the tables and plots.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.experiments.bank import LABELS_FILE
from trainer.experiments.report.cost import conditions_section, cost_section
from trainer.experiments.report.evaluation import eval_section, table1_section
from trainer.experiments.report.experience import guided_free_section, usefulness_section
from trainer.experiments.report.extractor import extractor_section
from trainer.experiments.report.merges import merge_section
from trainer.experiments.report.quality import quality_section
from trainer.experiments.report.render import table
from trainer.experiments.report.runs import RunResult, by_arm, load_results
from trainer.experiments.report.same_slot import same_slot_section
from trainer.runfiles import read_lines


def build_report(folder: Path, out_dir: Path | None = None) -> Path:
    """Write ``report.md``, the plots and ``summary.csv`` into ``out_dir`` [folder/report]; returns it.
    ``trainer.experiments.summary.write_report`` adds the results page's summary beside them."""
    folder = Path(folder)
    out = Path(out_dir) if out_dir else folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    runs = load_results(folder)
    if not runs:
        raise ValueError(f"no runs under {folder / 'runs'}")
    eval_md, eval_rows = eval_section(runs, out)
    cost_md, cost_rows = cost_section(runs)
    experience = [
        guided_free_section(runs, out),
        usefulness_section(runs),
        same_slot_section(runs),
        merge_section(runs),
        quality_section(runs, out, read_lines(folder / LABELS_FILE)),
    ]
    parts = [
        f"# Experiment {folder.name}",
        "",
        f"Built from the result files in `{folder.name}/runs/` by `trainer.experiments.report`. "
        f"{len(runs)} runs; arms: {', '.join(f'{a} ({len(rs)} seeds)' for a, rs in by_arm(runs).items())}.",
        "",
        _runs_table(runs),
        "",
        conditions_section(runs),
        eval_md,
        table1_section(runs),
        "## 3. What the experience did",
        "",
        *experience,
        extractor_section(runs, out),
        cost_md,
    ]
    (out / "report.md").write_text("\n".join(parts), encoding="utf-8")
    _write_summary(out / "summary.csv", eval_rows, cost_rows)
    return out


def _runs_table(runs: Sequence[RunResult]) -> str:
    """The runs the report covers: each one's method, status and the steps it trained and evaluated."""
    rows = [
        [r.slug, r.method, r.status or "?", max(r.train, default=0), ", ".join(map(str, sorted(r.evals)))]
        for r in runs
    ]
    return table(["run", "method", "status", "train steps", "eval steps"], rows)


def _write_summary(path: Path, eval_rows: list[dict[str, Any]], cost_rows: list[dict[str, Any]]) -> None:
    costs = {c["run"]: c for c in cost_rows}
    rows = [
        {**e, **{f"cost:{k}": v for k, v in costs.get(e["run"], {}).items() if k != "run"}} for e in eval_rows
    ]
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m trainer.experiments.report docs/experiments/<name>", file=sys.stderr)
        return 2
    print(f"report: {build_report(Path(args[0])) / 'report.md'}")
    return 0
