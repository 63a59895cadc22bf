"""Section 3, bank quality: each run's bank rebuilt from its change history and checked against the size
it recorded, the mechanical rule's shares over the final bank, and the hand labels beside them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.experiments.bank import LABELS_FILE, Bank, BankReplay, agreement, shares
from trainer.experiments.report.render import fmt, pyplot, save_figure, step_axis, table
from trainer.experiments.report.runs import RunResult
from trainer.experiments.stats import wilson_interval


def bank_replay(r: RunResult) -> BankReplay:
    """The run's bank rebuilt in applied order, checked against its recorded ``bank/size``."""
    return BankReplay.of(r.changes, dict(zip(*r.train_series("bank/size"), strict=True)))


def label_lines(labels: Sequence[dict[str, Any]], finals: dict[str, Any]) -> list[str]:
    """The hand labels' verdict on the final banks, and the rule's precision and recall against them."""
    if not labels:
        return [
            f"No entry of this experiment was labelled by hand (`{LABELS_FILE}`): the rule's shares above "
            "are not validated and say nothing about quality."
        ]
    a = agreement(labels, finals)
    share = wilson_interval(a.useful, a.labelled)
    lines = [
        f"**Hand labels** (`{LABELS_FILE}`, rule in `docs/experiments/README.md`): {a.useful} of "
        f"{a.labelled} entries drawn from the final banks are useful (share {fmt(share.mean)}, Wilson 95% "
        f"[{fmt(share.low)}, {fmt(share.high)}]). Against them the mechanical rule marks {a.marked} good, "
        f"{a.marked_useful} of them useful: precision {fmt(a.precision)}, recall {fmt(a.recall)}. The "
        "rule's share is therefore not a measure of quality; the labelled share is.",
    ]
    if a.stale:
        lines += ["", f"**STALE LABELS**: not in the final bank as labelled: {', '.join(a.stale)}."]
    return lines


QUALITY_HEADER = [
    "run",
    "final entries (rebuilt)",
    "bank/size at last step",
    "steps matching bank/size",
    "names an action",
    "names an object",
    "duplicates",
    "marked good",
]


def quality_section(runs: Sequence[RunResult], out: Path, labels: Sequence[dict[str, Any]] = ()) -> str:
    rs = [r for r in runs if r.changes]
    if not rs:
        return "### Bank quality\n\nNo bank entry was written.\n"
    replays = {r.slug: bank_replay(r) for r in rs}
    rebuilt = {slug: replay.banks() for slug, replay in replays.items()}
    finals = {slug: final for slug, (_, final) in rebuilt.items()}
    warnings = [
        f"**MISMATCH** {slug}: the rebuilt bank never has the recorded `bank/size` at steps "
        f"{', '.join(map(str, replay.mismatched))}."
        for slug, replay in replays.items()
        if replay.mismatched
    ]
    lines = [
        "### Bank quality: the bank as it was, hand labels, and the mechanical rule beside them",
        "",
        "Each run's bank rebuilt from `changes.jsonl` in the order the changes were applied (their ids), "
        "checked against the `bank/size` the run recorded at every step: a step matches when the rebuilt "
        "bank passes through the recorded size after the previous step's point and before any change "
        "stamped with a later step. An entry is marked *good* by the mechanical rule if it names an action "
        "or a symbol/object of the environment (word lists in `trainer/experiments/bank.py`) and is not a "
        "duplicate (token Jaccard ≥ 0.8 with an entry of lower id): a screen, validated below against "
        "hand labels. Shares over the final bank (every change applied):",
        "",
        table(QUALITY_HEADER, [_quality_row(slug, replay, finals[slug]) for slug, replay in replays.items()]),
        *(["", *warnings] if warnings else []),
        "",
        *label_lines(labels, finals),
    ]
    _plot_bank_sizes(replays, {slug: banks for slug, (banks, _) in rebuilt.items()}, out / "bank_quality.png")
    return "\n".join([*lines, "", "![bank size, rebuilt vs recorded](bank_quality.png)", ""])


def _quality_row(slug: str, replay: BankReplay, final: Bank) -> list[Any]:
    """A run's final bank: its size beside the recorded one, the steps that match, the rule's shares."""
    q = shares(final)
    last = max(replay.recorded, default=None)
    checked = f"{replay.checked - len(replay.mismatched)} / {replay.checked}" if replay.checked else "–"
    recorded = replay.recorded.get(last, "–") if last is not None else "–"
    rule = [fmt(q[k]) for k in ("action", "object", "duplicate", "good")]
    return [slug, q["entries"], recorded, checked, *rule]


def _plot_bank_sizes(replays: dict[str, BankReplay], banks: dict[str, dict[int, Bank]], path: Path) -> None:
    """Each run's rebuilt bank size per step (line) beside the ``bank/size`` it recorded (crosses)."""
    fig, ax = pyplot().subplots(figsize=(8, 3.5))
    for slug, replay in replays.items():
        steps = sorted(banks[slug])
        line = ax.plot(steps, [len(banks[slug][s]) for s in steps], marker=".", label=f"{slug} rebuilt")[0]
        recorded = sorted(replay.recorded)
        ax.plot(recorded, [replay.recorded[s] for s in recorded], "x", color=line.get_color(), alpha=0.6)
    step_axis(ax)
    ax.set_ylabel("entries (line: rebuilt; x: bank/size)")
    ax.legend(fontsize=7)
    save_figure(fig, path)
