"""An API launch request as the launch form's data: the page and the API judge a launch with one form."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from ninja.errors import ValidationError

from api.schemas import LaunchChanges
from trainer.config import PRESETS, RunConfig, get_preset
from webapp.charts import flatten
from webapp.forms import CONFIG_FIELDS, LaunchForm, config_initial

FIELD_OF_KEY = {key: name for name, key in CONFIG_FIELDS.items()}
API_NAME_OF_FIELD = CONFIG_FIELDS | {"overrides": "config", "__all__": "plan"}
"""Form field -> the name an API caller used: its config key (other keys all travel as ``overrides``); the
form's own errors are the plan's refusal."""


def _override_text(value: Any) -> str:
    """A JSON value as the form's ``key=value`` text (the config reads it back by the key's type)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
_NUMBER_TYPES = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
"""A setting's type -> the JSON value types it takes (a JSON integer is a Python int, never a bool)."""


def json_type(value: Any) -> str:
    return "null" if value is None else JSON_TYPE.get(type(value), type(value).__name__)


def setting_types(cls: type = RunConfig, prefix: str = "") -> dict[str, Any]:
    """Every config setting by dotted key -> its declared type (``X | None`` as declared)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            out |= setting_types(tp, f"{prefix}{field.name}.")
        else:
            out[f"{prefix}{field.name}"] = tp
    return out


SETTING_TYPES = setting_types()


def _leaves(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to values, like ``flatten``, but an empty object stays a value (to be refused)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _plain(tp: Any) -> Any:
    """``X | None`` -> ``X``; any other type as it is."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    is_union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    return args[0] if is_union and len(args) == 1 else tp


def _refusal(tp: Any, value: Any) -> str | None:
    """Why ``value`` cannot be a setting of type ``tp`` as JSON sends it (None: it can, or the form judges:
    null, and types other than a number, a boolean or text)."""
    if isinstance(value, dict):
        return "an object is never a value; give the setting's own value"
    takes = _NUMBER_TYPES.get(_plain(tp))
    if value is None or takes is None or (type(value) in takes):
        return None
    wanted = " or ".join(f"a JSON {JSON_TYPE[t]}" for t in dict.fromkeys(takes))
    return f"expected {wanted}, got a JSON {json_type(value)}"


def check_json_types(config: Mapping[str, Any]) -> None:
    """Refuse (422, naming each key) a config value of another JSON type than its setting's declared one."""
    errors = [
        {"loc": ("body", "body", key), "msg": why, "type": "type_error"}
        for key, value in _leaves(config).items()
        if (why := _refusal(SETTING_TYPES.get(key), value))
    ]
    if errors:
        raise ValidationError(errors)


def launch_form(changes: LaunchChanges, *, base: dict[str, Any], defaults: dict[str, Any]) -> LaunchForm:
    """The bound launch form for ``changes`` on top of the config ``base``; ``defaults`` fill name, tags,
    shared and preset where the request leaves them out. A value of another JSON type than its setting's
    is refused here, before the form (which reads text) could coerce it."""
    check_json_types(changes.config)
    data = config_initial(base)
    overrides = []
    for key, value in flatten(changes.config).items():
        if key in FIELD_OF_KEY:
            data[FIELD_OF_KEY[key]] = value
        else:
            overrides.append(f"{key}={_override_text(value)}")

    def given(name: str) -> Any:
        value = getattr(changes, name)
        return defaults.get(name) if value is None else value

    tags = given("tags")
    data |= {
        "preset": defaults.get("preset", "cpu"),
        "name": given("name") or "",
        "tags": tags if isinstance(tags, str) else ", ".join(tags or []),
        "shared": bool(given("shared")),
        "n_seeds": changes.n_seeds,
        "overrides": "\n".join(overrides),
        "submission": changes.submission,
        "experiment": changes.experiment,
        "experiment_methods": changes.experiment_methods,
        "experiment_seeds": changes.experiment_seeds,
    }
    return LaunchForm(data, by_label=False)  # the API names settings by their keys


def preset_base(preset: str) -> dict[str, Any]:
    """The preset's config; an unknown preset leaves it empty (the form refuses the preset by name)."""
    return get_preset(preset).to_dict() if preset in PRESETS else {}


def form_errors(form: LaunchForm) -> dict[str, list[str]]:
    """The form's messages, keyed by what the API caller wrote (a config key, or a launch field)."""
    return {API_NAME_OF_FIELD.get(f, f): [str(m) for m in messages] for f, messages in form.errors.items()}
