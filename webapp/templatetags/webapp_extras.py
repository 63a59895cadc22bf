"""Small template helpers for the dashboard."""

from __future__ import annotations

from typing import Any

from django import forms, template
from django.utils.html import format_html

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
