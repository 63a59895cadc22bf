"""An API launch request as the launch form's data: the page and the API judge a launch with one form."""

from __future__ import annotations

from typing import Any

from api.schemas import LaunchChanges
from trainer.config import PRESETS, get_preset
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


def launch_form(changes: LaunchChanges, *, base: dict[str, Any], defaults: dict[str, Any]) -> LaunchForm:
    """The bound launch form for ``changes`` on top of the config ``base``; ``defaults`` fill name, tags,
    shared and preset where the request leaves them out."""
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
    return LaunchForm(data)


def preset_base(preset: str) -> dict[str, Any]:
    """The preset's config; an unknown preset leaves it empty (the form refuses the preset by name)."""
    return get_preset(preset).to_dict() if preset in PRESETS else {}


def form_errors(form: LaunchForm) -> dict[str, list[str]]:
    """The form's messages, keyed by what the API caller wrote (a config key, or a launch field)."""
    return {API_NAME_OF_FIELD.get(f, f): [str(m) for m in messages] for f, messages in form.errors.items()}
