"""Where the runs' time went: "Conditions and time" (what each cell ran under, and its wall time split into
training, interruptions and the extractor's tail) and section 5, the cost per phase and in tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer.experiments.conditions import GAP_S, conditions, hours, mixed, time_account
from trainer.experiments.report.merges import merge_attempts
from trainer.experiments.report.render import fmt, table
from trainer.experiments.report.runs import RunResult, by_arm

PHASES = (
    ("rollout", "time/rollout_s", "sum"),
    ("actor backward", "time/backward_s", "sum"),
    ("old log-prob recompute", "time/recompute_s", "sum"),
    ("weight sync", "time/sync_s", "sum"),
    ("retrieval", "experience/retrieve_s", "last"),
    ("extractor distil", "extractor/distil_s", "last"),
    ("extractor merge", "extractor/merge_s", "last"),
    ("extractor training", "extractor/update_s", "last"),
)


def cumulative_total(values: Sequence[float]) -> float:
    """The total of a counter that runs up over a run's rows and starts again from zero when an attempt
    resumed without it: the sum of its rises, a fall counting from zero."""
    total, before = 0.0, 0.0
    for v in values:
        total += v - before if v >= before else v
        before = v
    return total


def cost_row(r: RunResult) -> dict[str, float]:
    row = {
        "steps": float(len(r.train)),
        "step time": sum(r.train_series("time/step_s")[1]),
        "evaluation": sum(r.eval_series("eval/time_s")[1]),
    }
    for name, key, how in PHASES:
        values = r.train_series(key)[1]
        row[name] = sum(values) if how == "sum" else cumulative_total(values)
    row["actor tokens"] = sum(r.train_series("rollout/generated_tokens")[1])
    row["extractor tokens"] = sum(
        r.last_train(f"extractor/{job}_tokens") for job in ("distil", "merge", "refine")
    )
    return row


def cost_section(runs: Sequence[RunResult]) -> tuple[str, list[dict[str, Any]]]:
    cols = ["step time", "evaluation"] + [p[0] for p in PHASES] + ["actor tokens", "extractor tokens"]
    rows, summary = [], []
    for arm, rs in by_arm(runs).items():
        costs = [cost_row(r) for r in rs]
        rows.append([arm, len(rs)] + [fmt(sum(c[k] for c in costs) / len(costs), 0) for k in cols])
        summary += [{"run": r.slug, **c} for r, c in zip(rs, costs, strict=True)]
    caveats = [
        f"- {arm}: CPU {note}: its mean {'mixes' if 'different' in note else 'may mix'} machines of "
        "different speed."
        for arm, rs in by_arm(runs).items()
        if (note := mixed([conditions(r.cell)["cpu"] for r in rs]))
    ]
    lines = [
        "## 5. Cost",
        "",
        "Per run, mean over seeds: seconds the run spent in each phase, summed over its rows (step time and "
        "evaluation are the actor loop's own times: what it cost, with no interruption or restart in it; "
        "the extractor's phases run on a background thread beside the actor's, on the same cores) and "
        "generated tokens. Wall time is not a cost here: see Conditions and time. CPU seconds were not "
        "recorded. The paper reports no extractor cost.",
        "",
        table(["arm", "seeds"] + cols, rows),
        "",
        *(["Where the cells of an arm ran on different CPUs (Conditions and time):", "", *caveats, ""]
          if caveats else []),
        table(
            ["run", "CPU", "step time + evaluation", "actor tokens", "extractor tokens"],
            [
                [r.slug, conditions(r.cell)["cpu"], hours(c["step time"] + c["evaluation"]),
                 fmt(c["actor tokens"], 0), fmt(c["extractor tokens"], 0)]
                for r, c in ((r, cost_row(r)) for r in runs)
            ],
        ),
        "",
    ]  # fmt: skip
    return "\n".join(lines), summary


RAN_UNDER = ("commit", "cpu", "native bf16", "threads", "resumed at steps", "torch", "vllm")
"""What ``conditions`` tells of a cell, in the table's order."""
CONDITIONS_HEADER = ["run", "commit", "CPU", "native bf16", "threads", "resumed at steps", "torch", "vLLM",
                     "wall", "trained", "after the last eval", "interruptions", "passes run twice",
                     "other"]  # fmt: skip


def conditions_section(runs: Sequence[RunResult]) -> str:
    """Per cell, what it ran under and where its wall time went; a flag for each arm whose cells differ."""
    flags = [
        f"- **MIXED CONDITIONS** {arm}: {key}: {note}."
        for arm, rs in by_arm(runs).items()
        for key in ("commit", "cpu")
        if (note := mixed([conditions(r.cell)[key] for r in rs]))
    ]
    grid = [mixed([conditions(r.cell)[key] for r in runs]) for key in ("commit", "cpu")]
    lines = [
        "## Conditions and time",
        "",
        "What each cell ran under (`cell.json`: the commit, the processor's vector ISA and native bf16 where "
        "recorded; torch's threads and the steps its attempts resumed from, for cells trained since "
        "2026-12-04), and where its wall time went: *trained* = the steps' and "
        "evaluations' own seconds (what section 5 compares); *after the last eval* = until the last row, "
        "the extractor's queued work finishing (an interruption during it is inside); *interruptions* = "
        f"pauses between rows longer than {GAP_S / 60:.0f} min beyond the later row's own time (restarts, "
        "stopped machines); *passes run twice* = merge passes a crash cut short and the resumed run ran "
        "again (`merges.jsonl`); *other* = wall time left (start-up, time before the first row kept, short "
        "waits).",
        "",
        table(CONDITIONS_HEADER, map(_conditions_row, runs)),
        "",
        *_flag_lines(flags),
        f"Over the whole grid: commit {grid[0] or 'one'}; CPU {grid[1] or 'one kind'}.",
        "",
    ]
    return "\n".join(lines)


def _conditions_row(r: RunResult) -> list[Any]:
    """A cell's conditions and its wall time split into trained, the extractor's tail, pauses and the rest."""
    c = conditions(r.cell)
    t = time_account(list(r.train.values()) + list(r.evals.values()), r.cell)
    attempts = merge_attempts(r.merges)
    twice = len(attempts) - len({step for step, _ in attempts})
    pauses = ", ".join(f"{hours(g)} before {where}" for where, g in t["interruptions"]) or "none"
    ran_under = [c[k] for k in RAN_UNDER]
    times = [hours(t["wall"]), hours(t["trained"]), hours(t["tail"]), pauses, f"{twice}" if twice else "–"]
    return [r.slug, *ran_under, *times, hours(t["other"])]


def _flag_lines(flags: list[str]) -> list[str]:
    if not flags:
        return ["Every arm's cells ran under one commit and one recorded CPU kind.", ""]
    return [
        "Cells of one arm that ran under different code or hardware (their differences mix the method's "
        "effect with the conditions'; timings across CPU kinds do not compare):",
        "",
        *flags,
        "",
    ]
