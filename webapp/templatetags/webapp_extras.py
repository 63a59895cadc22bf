"""Small template helpers for the dashboard."""

from __future__ import annotations

import difflib
from typing import Any

from django import forms, template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()


@register.simple_tag
def formfield(field: forms.BoundField) -> str:
    """A labelled field with its help text and its errors right next to it (id ``error-<name>``)."""
    errors = (
        format_html('<p class="error" id="error-{}">{}</p>', field.name, " ".join(field.errors))
        if field.errors
        else ""
    )
    help_text = format_html('<small class="muted">{}</small>', field.help_text) if field.help_text else ""
    return format_html('<div class="field">{}{}{}{}</div>', field.label_tag(), field, help_text, errors)


@register.filter
def field(form: forms.Form, name: str) -> forms.BoundField:
    return form[name]


@register.filter
def split(value: str) -> list[str]:
    return value.split()


@register.filter
def get(mapping: Any, key: Any) -> Any:
    try:
        return mapping[key]
    except (KeyError, IndexError, TypeError):
        return None


@register.filter
def num(value: Any, digits: int = 3) -> str:
    """A metric value for a table: '–' when missing, else at most ``digits`` decimals."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if abs(value) < 1e5 else f"{value:.3g}"
    return str(value)


TURN_ORDER = (
    "observation",
    "action_text",
    "action",
    "reward",
    "invalid",
    "done",
    "intercepted",
    "finish_reason",
)
"""Fields of ``trainer.rollout.runner.Turn`` in reading order; others follow as recorded."""


@register.filter
def turn_items(turn: Any) -> list[tuple[str, Any]]:
    """A recorded turn's fields, the usual ones first; a turn that is not a dict shows as itself."""
    if not isinstance(turn, dict):
        return [("turn", turn)]
    known = [(k, turn[k]) for k in TURN_ORDER if k in turn]
    return known + [(k, v) for k, v in turn.items() if k not in TURN_ORDER]


@register.filter
def subgroups(group: Any) -> list[tuple[str, list[Any]]]:
    """A task group's two subgroups, side by side."""
    return [("With experience", group.guided), ("Without experience", group.free)]


DIFFED = ("title", "content")
"""An entry's texts, shown word by word as what a change removed and added."""
FLAGGED = ("scope", "pinned", "deleted")
"""Other fields a change can alter, shown as ``field: before → after``."""


@register.filter
def change_diff(before: dict | None, after: dict) -> str:
    """What a bank change did to its entry: its texts word by word (``<del>`` removed, ``<ins>`` added) and
    any other field it altered; a created entry shows its texts as added."""
    before = before or {}
    parts = [
        _word_diff(before.get(k, ""), after.get(k, ""), k) for k in DIFFED if before.get(k) != after.get(k)
    ]
    parts += [
        format_html('<div class="diff-flag">{}: {} → {}</div>', k, before.get(k, "—"), after.get(k))
        for k in FLAGGED
        if before and before.get(k) != after.get(k)
    ]
    return (
        mark_safe("".join(parts)) if parts else format_html('<span class="muted">{}</span>', "no text change")
    )


def _word_diff(old: str, new: str, name: str) -> str:
    a, b = old.split(), new.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            out.append(format_html("<del>{}</del>", " ".join(a[i1:i2])))
        if op in ("insert", "replace"):
            out.append(format_html("<ins>{}</ins>", " ".join(b[j1:j2])))
        if op == "equal":
            out.append(format_html("{}", " ".join(a[i1:i2])))
    return format_html(
        '<div class="diff" data-field="{}"><b>{}</b> {}</div>', name, name, mark_safe(" ".join(out))
    )
