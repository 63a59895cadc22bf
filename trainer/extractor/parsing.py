"""Lenient parsing of the extractor's answers: never raises, always says what it could not use.

vLLM's structured outputs make answers valid JSON, except when a generation hits ``max_new_tokens`` mid-way;
the transformers engine cannot constrain at all. So every parser here:

1. finds the first JSON object in the text (chatter around it is ignored),
2. closes a truncated object (open string, arrays, objects) and tries again,
3. keeps the well-formed items and drops the rest, counting each dropped item as an error.

A result with ``ok=False`` means nothing usable was found: the caller records and counts it, and the loop
goes on (an unparseable merge keeps the originals; an unparseable distillation changes nothing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.extractor.prompts import ADVICE_MAX, CONTENT_MAX, TITLE_MAX
from trainer.store import MergeAction


@dataclass(frozen=True)
class ParsedOp:
    """One distil operation as the extractor wrote it (``kind``: add, update or return)."""

    kind: str
    title: str = ""
    content: str = ""


@dataclass
class Parsed:
    """What a parser made of one answer: ``items`` it could use, ``errors`` for what it could not."""

    items: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ok: bool = True
    """False when nothing usable was found (the answer counts as unparseable)."""
    repaired: bool = False
    """The JSON was truncated and had to be closed."""


def _close_truncated(text: str) -> str:
    """Close an open string and every open array/object of a JSON prefix, dropping a dangling key or comma."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}" and stack:
            stack.pop()
    out = text + ('"' if in_string else "")
    out = out.rstrip()
    # a trailing comma, colon or bare key cannot be closed into valid JSON: cut back to the last value
    while out and out[-1] in ",:":
        out = out[:-1].rstrip()
        if out.endswith('"') and stack and stack[-1] == "}":
            # drop the dangling key '"key"' before the removed colon
            start = out.rfind('"', 0, len(out) - 1)
            out = out[:start].rstrip()
    return out + "".join(reversed(stack))


def find_json_object(text: str) -> tuple[dict[str, Any] | None, bool]:
    """The first JSON object in ``text`` and whether it had to be repaired; (None, False) if there is none."""
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
            if isinstance(obj, dict):
                return obj, False
        except json.JSONDecodeError:
            try:
                obj = json.loads(_close_truncated(text[start:]))
                if isinstance(obj, dict):
                    return obj, True
            except json.JSONDecodeError:
                pass
        start = text.find("{", start + 1)
    return None, False


def _clean(value: Any, limit: int) -> str:
    return value.strip()[:limit] if isinstance(value, str) else ""


def parse_distil(text: str, *, max_ops: int = 3, can_update: bool = True) -> Parsed:
    """Operations from a distil answer: ``{"operations": [{"op", "title", "content"}]}``.

    An ``add``/``update`` needs a title and content that says something (at least ``MIN_CONTENT_WORDS``
    words, not just its title again); one that repeats an earlier operation of the same answer is dropped (a
    small extractor often writes one entry three times); an ``update`` without a retrieved entry becomes an
    ``add``; operations beyond ``max_ops`` are dropped. A bare ``{"op": ...}`` object counts as one operation.
    """
    obj, repaired = find_json_object(text)
    out = Parsed(repaired=repaired)
    if obj is None:
        return Parsed(errors=["no JSON object in the answer"], ok=False)
    raw = obj.get("operations", [obj] if "op" in obj else None)
    if not isinstance(raw, list):
        return Parsed(errors=["no 'operations' list"], ok=False, repaired=repaired)
    seen: list[tuple[str, ...]] = []
    for i, item in enumerate(raw):
        if len(out.items) == max_ops:
            out.errors.append(f"operations beyond {max_ops} dropped")
            break
        kind = item.get("op") if isinstance(item, dict) else None
        kind = kind.strip().lower() if isinstance(kind, str) else None
        if kind == "return":
            out.items.append(ParsedOp("return"))
            continue
        if kind not in ("add", "update"):
            out.errors.append(f"operation {i}: unknown op {kind!r}")
            continue
        title, content = _clean(item.get("title"), TITLE_MAX), _clean(item.get("content"), CONTENT_MAX)
        if not title or not content:
            out.errors.append(f"operation {i}: {kind} without a title and content")
            continue
        if problem := _uninformative(title, content, seen):
            out.errors.append(f"operation {i}: {problem}")
            continue
        seen.append(_words(f"{title} {content}"))
        out.items.append(ParsedOp(kind if can_update else "add", title, content))
    out.ok = bool(out.items)
    return out


MIN_CONTENT_WORDS = 4
MIN_DISTINCT_WORDS = 0.35
"""Content whose distinct words are fewer than this share of its words is a degenerate loop."""


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"[a-z0-9<>@]+", text.lower()))


def _uninformative(title: str, content: str, seen: Sequence[tuple[str, ...]]) -> str | None:
    """Why an entry is not worth storing, or None."""
    words = _words(content)
    if sum(w.isalpha() for w in words) < MIN_CONTENT_WORDS:
        return f"content of {sum(w.isalpha() for w in words)} words says nothing reusable"
    if len(words) >= 8 and len(set(words)) / len(words) < MIN_DISTINCT_WORDS:
        return "content repeats itself"
    if words == _words(title):
        return "content repeats the title"
    if _words(f"{title} {content}") in seen:
        return "repeats an earlier operation of this answer"
    return None


def parse_merge(text: str, ids: Sequence[int]) -> Parsed:
    """Merge actions over the chunk's ``ids``; items naming other ids or lacking text are dropped.

    An empty action list is a valid "keep everything". Whether the surviving actions make sense together
    (no entry claimed twice) is the store's check (``experience.bank.validate_plan``).
    """
    obj, repaired = find_json_object(text)
    if obj is None:
        return Parsed(errors=["no JSON object in the answer"], ok=False)
    raw = obj.get("actions")
    if not isinstance(raw, list):
        return Parsed(errors=["no 'actions' list"], ok=False, repaired=repaired)
    out = Parsed(repaired=repaired)
    known = set(ids)
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            out.errors.append(f"action {i}: not an object")
            continue
        kind = item.get("kind")
        raw_ids = item.get("ids")
        if kind not in ("keep", "discard", "rewrite", "merge"):
            out.errors.append(f"action {i}: unknown kind {kind!r}")
            continue
        if not isinstance(raw_ids, list) or not raw_ids or not all(isinstance(x, int) for x in raw_ids):
            out.errors.append(f"action {i}: ids must be a list of entry ids")
            continue
        if not set(raw_ids) <= known:
            out.errors.append(f"action {i}: ids {sorted(set(raw_ids) - known)} are not in this chunk")
            continue
        title, content = _clean(item.get("title"), TITLE_MAX), _clean(item.get("content"), CONTENT_MAX)
        if kind in ("rewrite", "merge") and not (title and content):
            out.errors.append(f"action {i}: {kind} without a title and content")
            continue
        if kind == "rewrite" and len(raw_ids) != 1:
            out.errors.append(f"action {i}: rewrite takes exactly one id")
            continue
        out.items.append(MergeAction(kind, tuple(dict.fromkeys(raw_ids)), title, content))
    # an answer whose every action was bad is unparseable; an empty list is "keep all"
    out.ok = bool(out.items) or not raw
    return out


def parse_refine(text: str) -> Parsed:
    """The advice of a refine answer, ``{"advice": "..."}``; without JSON the plain text itself is used
    (it is advice for the actor either way) but the answer still counts as unparseable."""
    obj, repaired = find_json_object(text)
    advice = _clean(obj.get("advice"), ADVICE_MAX) if obj is not None else ""
    if advice:
        return Parsed(items=[advice], repaired=repaired)
    plain = text.strip()[:ADVICE_MAX]
    return Parsed(items=[plain] if plain else [], errors=["no 'advice' in the answer"], ok=False)
