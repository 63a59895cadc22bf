"""What the extractor πϕ reads, and the JSON it must answer with (docs/design.md §3.2, §3.3).

Three jobs, one chat each:

- **distil**: a finished episode (goal, trajectory, outcome, the entry that guided it if any) → up to
  ``max_ops`` operations: ``add`` a new entry, ``update`` the retrieved entry, or ``return`` (nothing worth
  keeping);
- **merge**: a chunk of bank entries → keep / discard / rewrite / merge actions over their ids;
- **refine** (Search-and-Ask): the actor's query and the retrieved entry → advice for its situation.

Each job has a JSON schema, passed to vLLM as a structured-output constraint so that even a 135M model's
answers parse; the transformers engine cannot constrain its output, so ``trainer.extractor.parsing`` is
lenient (a JSON object anywhere in the text, truncated JSON closed, bad items dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainer.store import Entry

TITLE_MAX = 80
CONTENT_MAX = 600
ADVICE_MAX = 600

DISTIL_SYSTEM = """\
You maintain an experience bank for an agent that plays text games. Read the episode below and write \
reusable experience: a short title and content with the context, a good action sequence, if-then decision \
rules, and mistakes to avoid. Keep it abstract (no instance-specific coordinates or names). Operations:
- "add": a new entry;
- "update": rewrite the retrieved entry shown below (only when one is shown);
- "return": nothing worth keeping (say why in one line).
Write each content as one or two full sentences saying in which situation to do what, in the game's own \
words for its symbols and actions (the commands it accepts). Every operation must say something different.
Answer with JSON only: {"operations": [{"op": "add", "title": "...", "content": "..."}]}, at most \
{max_ops} operations."""

MERGE_SYSTEM = """\
You curate an experience bank. Below are entries with their ids. Remove duplicates and useless entries, \
combine entries that say the same thing, and keep the rest. Actions:
- "keep": leave the entries as they are;
- "discard": delete the entries;
- "rewrite": replace the text of one entry (give a new title and content);
- "merge": replace several entries by one new entry (give its title and content).
Answer with JSON only: {"actions": [{"kind": "merge", "ids": [1, 2], "title": "...", "content": "..."}]}. \
An empty list keeps everything."""

REFINE_SYSTEM = """\
An agent playing a text game asked the experience bank a question. Rewrite the stored experience below into \
short, concrete advice for the agent's question. Answer with JSON only: {"advice": "..."}"""


def _truncate(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@dataclass(frozen=True)
class Step:
    """One turn of a trajectory as the extractor reads it."""

    observation: str
    action: str


def render_trajectory(steps: Sequence[Step], budget_chars: int = 2400, obs_chars: int = 300) -> str:
    """Turns as "Observation / Action" pairs, each observation cut to ``obs_chars``; when the whole does not
    fit ``budget_chars`` the earliest turns go first (the end of an episode says most about its outcome)."""
    lines = [
        f"Turn {i + 1}\nObservation: {_truncate(s.observation, obs_chars)}\n"
        f"Action: {_truncate(s.action, 120)}"
        for i, s in enumerate(steps)
    ]
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        if used + len(line) > budget_chars and kept:
            kept.append(f"({len(lines) - len(kept)} earlier turns omitted)")
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(reversed(kept))


def distil_messages(
    goal: str,
    steps: Sequence[Step],
    success: bool,
    reward: float,
    retrieved: Entry | None,
    *,
    max_ops: int = 3,
    budget_chars: int = 2400,
) -> list[dict[str, str]]:
    """The distil chat: goal, trajectory, outcome and the retrieved entry (or none)."""
    outcome = "SUCCESS" if success else "FAILURE"
    shown = (
        f"Retrieved entry (it guided this episode):\nTitle: {retrieved.title}\nContent: {retrieved.content}"
        if retrieved is not None
        else "Retrieved entry: none (this episode had no experience)."
    )
    user = (
        f"Goal: {goal.strip()}\n\nTrajectory:\n{render_trajectory(steps, budget_chars)}\n\n"
        f"Outcome: {outcome} (reward {reward:g}, {len(steps)} actions)\n\n{shown}"
    )
    return [
        {"role": "system", "content": DISTIL_SYSTEM.replace("{max_ops}", str(max_ops))},
        {"role": "user", "content": user},
    ]


def merge_messages(chunk: Sequence[Entry]) -> list[dict[str, str]]:
    """The merge chat: every entry of the chunk with its number in the chunk (1, 2, ...) as its id, not its
    database id, so that a chunk's prompt is the same in any bank (``Extractor.merge_fn`` maps them back)."""
    listed = "\n\n".join(
        f"[id {i}] Title: {e.title}\nContent: {_truncate(e.content, 500)}" for i, e in enumerate(chunk, 1)
    )
    return [{"role": "system", "content": MERGE_SYSTEM}, {"role": "user", "content": f"Entries:\n\n{listed}"}]


def refine_messages(query: str, entry: Entry) -> list[dict[str, str]]:
    """The Search-and-Ask chat: the actor's question and the best entry for it."""
    user = f"Question: {query.strip()}\n\nStored experience:\nTitle: {entry.title}\nContent: {entry.content}"
    return [{"role": "system", "content": REFINE_SYSTEM}, {"role": "user", "content": user}]


# ---- JSON schemas (vLLM structured outputs) --------------------------------------------------------


def _text(max_length: int, min_length: int = 0) -> dict[str, Any]:
    return {"type": "string", "minLength": min_length, "maxLength": max_length}


def distil_schema(max_ops: int = 3, can_update: bool = True) -> dict[str, Any]:
    """``{"operations": [{"op", "title", "content"}, ...]}`` with 1..max_ops items; no "update" without a
    retrieved entry."""
    ops = ["add", "update", "return"] if can_update else ["add", "return"]
    item = {
        "type": "object",
        "properties": {"op": {"enum": ops}, "title": _text(TITLE_MAX, 1), "content": _text(CONTENT_MAX, 1)},
        "required": ["op", "title", "content"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"operations": {"type": "array", "items": item, "minItems": 1, "maxItems": max_ops}},
        "required": ["operations"],
        "additionalProperties": False,
    }


def merge_schema(ids: Sequence[int]) -> dict[str, Any]:
    """``{"actions": [{"kind", "ids", "title", "content"}, ...]}``; ids limited to the chunk's own."""
    item = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["keep", "discard", "rewrite", "merge"]},
            "ids": {"type": "array", "items": {"enum": list(ids)}, "minItems": 1, "maxItems": len(ids)},
            "title": _text(TITLE_MAX),
            "content": _text(CONTENT_MAX),
        },
        "required": ["kind", "ids", "title", "content"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"actions": {"type": "array", "items": item, "maxItems": len(ids)}},
        "required": ["actions"],
        "additionalProperties": False,
    }


def refine_schema() -> dict[str, Any]:
    """``{"advice": "..."}``."""
    return {
        "type": "object",
        "properties": {"advice": _text(ADVICE_MAX, 1)},
        "required": ["advice"],
        "additionalProperties": False,
    }
