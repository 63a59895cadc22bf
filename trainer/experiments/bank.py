"""A run's bank as it was, rebuilt from its committed history (``changes.jsonl``), checked against the run.

Changes are replayed in the order they were applied: their ids. Their ``step`` is not that order: a merge
pass's changes carry the step that *requested* the pass and were applied later, after the next steps'
distillations, so sorting by step would undo a late merge's removals. The rebuilt size is then matched to
the ``bank/size`` the run itself recorded at every step (``BankReplay``): a rebuild that cannot reach a
step's recorded size is reported as a mismatch, not papered over.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Bank = dict[int, tuple[str, str]]
"""The live bank: entry id → (title, content)."""


def applied_order(changes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changes in the order they were applied to the bank (ids are given in that order)."""
    return sorted(changes, key=lambda c: c["id"])


def sizes_after(ordered: Sequence[dict[str, Any]]) -> list[int]:
    """``out[k]``: live entries once the first ``k`` changes of ``ordered`` were applied (``out[0]`` = 0)."""
    live: dict[int, bool] = {}
    out = [0]
    for c in ordered:
        now = not c.get("deleted")
        out.append(out[-1] + int(now) - int(live.get(c["entry"], False)))
        live[c["entry"]] = now
    return out


def _first_later(ordered: Sequence[dict[str, Any]], step: int) -> int:
    """Index of the first change stamped with a later step than ``step``: that step began after step's row
    was written (a distillation carries its episodes' step, a merge the step that asked for it)."""
    return next((i for i, c in enumerate(ordered) if c["step"] > step), len(ordered))


@dataclass
class BankReplay:
    """Per step, how many changes (in applied order) the bank had when the step's metrics row was written.

    ``recorded``: the run's own ``bank/size`` per step (empty where the metrics do not have it). With it,
    a step's cutoff is a point at or after the previous step's whose rebuilt size equals the recorded one
    and that comes before any change stamped with a later step (the latest such point); None
    where no such point exists (a mismatch). Without it, a step's cutoff is the latest point before a
    later step's changes (unchecked).
    """

    ordered: list[dict[str, Any]]
    recorded: dict[int, int]
    cutoffs: dict[int, int | None]
    sizes: list[int]

    @classmethod
    def of(cls, changes: Sequence[dict[str, Any]], recorded: Mapping[int, float]) -> BankReplay:
        ordered = applied_order(changes)
        recorded = {int(s): int(v) for s, v in recorded.items()}
        sizes = sizes_after(ordered)
        steps = sorted(recorded) or sorted({int(c["step"]) for c in ordered})
        highs = {step: _first_later(ordered, step) for step in steps}
        if not recorded:
            return cls(ordered, recorded, dict(highs), sizes)
        earliest: dict[int, int | None] = {}
        low = 0
        for step in steps:  # the earliest point each step can have: what keeps every later step possible
            earliest[step] = next(
                (k for k in range(low, highs[step] + 1) if sizes[k] == recorded[step]), None
            )
            low = earliest[step] if earliest[step] is not None else low
        cutoffs: dict[int, int | None] = {}
        high = len(ordered)
        for step in reversed(steps):  # then the latest, at most the next step's: the bank as the row saw it
            first = earliest[step]
            top = min(highs[step], high)
            cutoffs[step] = (
                None if first is None else max(k for k in range(first, top + 1) if sizes[k] == recorded[step])
            )
            high = cutoffs[step] if cutoffs[step] is not None else high
        return cls(ordered, recorded, cutoffs, sizes)

    @property
    def checked(self) -> int:
        """Steps whose recorded size was checked."""
        return len(self.recorded)

    @property
    def mismatched(self) -> list[int]:
        """Steps whose recorded ``bank/size`` no point of the rebuild reaches."""
        return [s for s, k in self.cutoffs.items() if k is None]

    def size_at(self, step: int) -> int | None:
        k = self.cutoffs.get(step)
        return None if k is None else self.sizes[k]

    @property
    def final_size(self) -> int:
        return self.sizes[-1]

    def banks(self) -> tuple[dict[int, Bank], Bank]:
        """The bank at each matched step, and the final bank (every change applied)."""
        wanted: dict[int, list[int]] = {}
        for step, k in self.cutoffs.items():
            if k is not None:
                wanted.setdefault(k, []).append(step)
        state: dict[int, tuple[str, str, bool]] = {}
        out: dict[int, Bank] = {}

        def snapshot() -> Bank:
            return {e: (t, b) for e, (t, b, live) in state.items() if live}

        for step in wanted.get(0, []):
            out[step] = {}
        for k, c in enumerate(self.ordered, 1):
            title, content, _ = state.get(c["entry"], ("", "", False))
            state[c["entry"]] = (c.get("title") or title, c.get("content") or content, not c.get("deleted"))
            if k in wanted:
                bank = snapshot()
                for step in wanted[k]:
                    out[step] = bank
        return out, snapshot()


# ---- the mechanical rule ----------------------------------------------------------------------------

ACTION_WORDS = re.compile(
    r"\b(north|south|east|west|northeast|northwest|southeast|southwest|move|go|walk|step|take|open|close|"
    r"put|heat|cool|clean|examine|use|search|click|buy|pick up|apply|push|unlock|toggle)\b",
    re.IGNORECASE,
)
OBJECT_WORDS = re.compile(
    r"(>|<|@|\b(staircase|stairs?|door|key|wall|trap|monster|legend|map|room|corridor|box|target|"
    r"fridge|microwave|sink|drawer|cabinet|countertop|product|price|option|test|function)s?\b)",
    re.IGNORECASE,
)


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9<>@]+", text.lower()))


def entry_quality(title: str, content: str, earlier: Sequence[set[str]]) -> dict[str, bool]:
    """The mechanical rule: the entry names an action, names a symbol or object of the env, and is not a
    duplicate (token Jaccard ≥ 0.8 with an entry already in the bank). ``good`` = (action or object) and
    not a duplicate."""
    text = f"{title}\n{content}"
    tokens = _tokens(text)
    action = bool(ACTION_WORDS.search(text))
    obj = bool(OBJECT_WORDS.search(text))
    dup = any(tokens and len(tokens & t) / len(tokens | t) >= 0.8 for t in earlier)
    return {"action": action, "object": obj, "duplicate": dup, "good": (action or obj) and not dup}


def bank_marks(bank: Bank) -> dict[int, dict[str, bool]]:
    """The rule's marks for every entry of a bank, duplicates judged against the entries of lower id."""
    seen: list[set[str]] = []
    marks = {}
    for entry, (title, content) in sorted(bank.items()):
        marks[entry] = entry_quality(title, content, seen)
        seen.append(_tokens(f"{title}\n{content}"))
    return marks


def shares(bank: Bank) -> dict[str, float]:
    """Live entries and the fractions that name an action / an object, are duplicates, are marked good."""
    marks = list(bank_marks(bank).values())
    n = max(len(marks), 1)
    return {
        "entries": len(marks),
        **{k: sum(m[k] for m in marks) / n for k in ("action", "object", "duplicate", "good")},
    }


# ---- hand labels --------------------------------------------------------------------------------------

LABELS_FILE = "labels.jsonl"
"""Entries of an experiment's final banks labelled by hand (useful / noise, one-line reason each); the
labelling rule is in ``docs/experiments/README.md``."""


@dataclass
class Agreement:
    """The mechanical rule against the hand labels: how many labelled entries, how many useful, how many
    the rule marks good, how many of those are useful; entries whose text no longer matches the bank."""

    labelled: int = 0
    useful: int = 0
    marked: int = 0
    marked_useful: int = 0
    stale: list[str] | None = None

    @property
    def precision(self) -> float:
        return self.marked_useful / self.marked if self.marked else float("nan")

    @property
    def recall(self) -> float:
        return self.marked_useful / self.useful if self.useful else float("nan")


def agreement(labels: Sequence[dict[str, Any]], finals: Mapping[str, Bank]) -> Agreement:
    """Score the rule's marks on the final banks (``finals``: run slug → bank) against the labels. A label
    whose entry is not in its run's final bank with the labelled title and content is listed as stale and
    not counted (the labels then need redoing)."""
    out = Agreement(stale=[])
    marks = {slug: bank_marks(bank) for slug, bank in finals.items()}
    for label in labels:
        bank = finals.get(label["run"], {})
        entry = int(label["entry"])
        if bank.get(entry) != (label["title"], label["content"]):
            out.stale.append(f"{label['run']}:{entry}")
            continue
        useful = label["label"] == "useful"
        good = marks[label["run"]][entry]["good"]
        out.labelled += 1
        out.useful += useful
        out.marked += good
        out.marked_useful += good and useful
    return out
