"""Forms: they turn request data into checked values; ``RunConfig`` itself is the judge of a config."""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import BadRequest
from django.core.validators import RegexValidator
from django.forms.utils import pretty_name
from django.http import QueryDict

from experience.selectors import PruneRule
from experience.transfer import CONTENT_MAX, FILE_MAX_BYTES, TITLE_MAX
from trainer import envs, paths
from trainer.config import METHODS, PRESETS, ConfigError, RunConfig, get_preset
from trainer.experiments.spec import ExperimentSpec
from webapp.models import Run
from webapp.selectors import ConfigTemplate, TemplateStart, config_templates, template_start

ABLATIONS = (
    "no_split",
    "cross_group",
    "no_merge",
    "no_search_and_ask",
    "no_diversification",
    "no_reweighting",
)
MAX_SEEDS = 16
INT_MAX = 2**31 - 1
"""The largest PostgreSQL ``integer`` (steps, versions, counters)."""
ID_MAX = 2**63 - 1
"""The largest PostgreSQL ``bigint`` (row ids)."""


# ---- numbers written with the digits 0-9 ---------------------------------------------------------------


class _AsciiNumber:
    """Python's ``int`` and ``float`` read any script's digits ("１２" is 12): a number field here takes the
    ASCII digits, sign, point and exponent only, so what is stored is what the page showed."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and not value.strip().isascii():
            raise forms.ValidationError("write the number with the digits 0-9", code="invalid")
        return super().to_python(value)  # type: ignore[misc]


class IntegerField(_AsciiNumber, forms.IntegerField):
    pass


class FloatField(_AsciiNumber, forms.FloatField):
    pass


# ---- checked values from request parameters ------------------------------------------------------------


class BadParameter(BadRequest):
    """A malformed or out-of-range request parameter: a 400 whose message names it and says what it takes."""


def int_param(
    params: QueryDict, name: str, *, default: int | None = None, min_value: int = 0, max_value: int = INT_MAX
) -> int | None:
    """The whole number ``params[name]`` within [min_value, max_value]; ``default`` when absent or empty;
    anything else is ``BadParameter`` (never a database error, never a silent default)."""
    raw = params.get(name, "")
    if raw == "":
        return default
    field = IntegerField(min_value=min_value, max_value=max_value)
    try:
        return field.clean(raw)
    except forms.ValidationError:
        raise BadParameter(
            f"{name} must be a whole number from {min_value} to {max_value} (got {raw[:40]!r})"
        ) from None


def choice_param(params: QueryDict, name: str, choices: Sequence[str], *, default: str) -> str:
    """``params[name]`` when it is one of ``choices``; ``default`` when absent or empty; anything else is
    ``BadParameter`` naming the choices."""
    raw = params.get(name, "")
    if raw == "":
        return default
    if raw not in choices:
        raise BadParameter(f"{name} must be one of {', '.join(choices)} (got {raw[:40]!r})")
    return raw


HIDDEN_CHARACTERS = {0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0xFEFF}
HIDDEN_CHARACTERS |= {*range(0x202A, 0x202F), *range(0x2066, 0x206A)}
"""Invisible and direction-changing characters: zero-width ones, bidi marks, embeddings, overrides and
isolates, line and paragraph separators (a name holding one reads differently from what it is)."""


def _hidden_character(char: str) -> bool:
    return ord(char) in HIDDEN_CHARACTERS or unicodedata.category(char) in ("Cc", "Cf")


def shown(text: str) -> str:
    """``text`` with each hidden character written as its code point, for a message that quotes it."""
    return "".join(f"<U+{ord(c):04X}>" if _hidden_character(c) else c for c in text)


def no_hidden_characters(text: str) -> None:
    """Refuse a name or tag holding a control, invisible or direction-changing character, naming it."""
    char = next((c for c in text if _hidden_character(c)), None)
    if char is None:
        return
    what = (
        "a control character"
        if unicodedata.category(char) == "Cc"
        else "an invisible or direction-changing character"
    )
    label = f"U+{ord(char):04X}" + (f" {unicodedata.name(char)}" if unicodedata.name(char, "") else "")
    raise forms.ValidationError(f"contains {what} ({label}); remove it")


# form field -> dotted config key: where a field's value goes, and which field a ConfigError is about
CONFIG_FIELDS = {
    "env": "env",
    "method": "method",
    **{name: name for name in ABLATIONS},
    "actor_model": "actor.model_path",
    "extractor_model": "extractor.model_path",
    "k_rollouts": "k_rollouts",
    "tasks_per_step": "tasks_per_step",
    "steps": "steps",
    "actor_lr": "actor.lr",
    "extractor_lr": "extractor.lr",
    "turn_limit": "rollout.turn_limit",
    "seed": "seed",
    "eval_every": "eval_every",
    "nproc": "nproc",
}
OPTIONAL_FIELDS = {"nproc"}
"""Fields left empty to keep the starting config's value (a form posted without them launches as before)."""


def env_choices() -> list[tuple[str, Any]]:
    return [
        ("Task mixtures", [(name, name) for name in envs.MIXTURES]),
        ("Environments", [(name, name) for name in envs.env_names()]),
    ]


def config_initial(config: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """Form values showing ``config`` (the hidden ``base`` keeps every key the form has no field for)."""
    data = config.to_dict() if isinstance(config, RunConfig) else config
    initial: dict[str, Any] = {"base": json.dumps(data)}
    for name, key in CONFIG_FIELDS.items():
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        initial[name] = node
    return initial


def _field_for(message: str) -> str | None:
    """The form field a ConfigError message is about (messages start with the dotted key)."""
    for name, key in sorted(CONFIG_FIELDS.items(), key=lambda kv: -len(kv[1])):
        if message.startswith((f"{key} ", f"{key}:")):
            return name
    return None


def template_initial(start: TemplateStart) -> dict[str, Any]:
    """The launch form's values for a template: a run config as it is; an experiment's first cell (its
    base, budget, first method and first seed) with its name, methods and seeds in the experiment fields."""
    if start.spec is None:
        return config_initial(start.config) | {"preset": start.preset if start.preset in PRESETS else "cpu"}
    return config_initial(start.config) | {
        "name": start.spec.description[:150],
        "experiment": start.experiment_name,
        "experiment_methods": list(start.spec.methods),
        "experiment_seeds": list(start.spec.seeds),
    }


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def model_roots() -> list[Path]:
    """Folders whose models a launch may use: the prepared models, plus the admin's ``STUDIO_MODEL_DIRS``."""
    return [paths.models_dir(), *(Path(p).resolve() for p in settings.STUDIO_MODEL_DIRS)]


def prepared_models() -> list[str]:
    """Every model folder (one with a config.json) directly inside the allowed folders."""
    return sorted(
        str(p.parent) for root in model_roots() if root.is_dir() for p in root.glob("*/config.json")
    )


def clean_model_path(value: str) -> str:
    """A prepared model's folder, or (where allowed) a hub id; anything else is refused with the choices."""
    value = value.strip()
    if settings.STUDIO_ALLOW_HUB_MODELS and HUB_ID.match(value) and not Path(value).exists():
        return value
    choices = ", ".join(prepared_models()) or "none: run manage.py prepare_models"
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # "~name" of a user who does not exist
        path = Path(value)
    if not path.is_absolute() or "\x00" in value:
        raise forms.ValidationError(f"give the full path of a prepared model (prepared: {choices})")
    path = path.resolve()
    if not any(path.is_relative_to(root) for root in model_roots()):
        raise forms.ValidationError(
            f"{value} is not in a folder models may come from (prepared: {choices}; an administrator can "
            "add folders with STUDIO_MODEL_DIRS)"
        )
    if not (path / "config.json").is_file():
        raise forms.ValidationError(f"{value} holds no model (no config.json); prepared: {choices}")
    return str(path)


class SeedsInput(forms.TextInput):
    """Seeds as one line of text ("0-4, 7"); repeated ``experiment_seeds`` parameters (older forms, scripts)
    are read as one list."""

    def value_from_datadict(self, data: Any, files: Any, name: str) -> Any:
        if hasattr(data, "getlist") and len(data.getlist(name)) > 1:
            return data.getlist(name)
        return data.get(name)

    def format_value(self, value: Any) -> str | None:
        if isinstance(value, list | tuple):
            return seed_ranges([int(v) for v in value])
        return super().format_value(value)


def seed_ranges(seeds: list[int]) -> str:
    """``[0, 1, 2, 4]`` as ``"0-2, 4"``."""
    runs: list[list[int]] = []
    for seed in sorted(set(seeds)):
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


class SeedListField(forms.Field):
    """Seeds written as ranges and numbers ("0-4, 7"), or a JSON list of whole numbers (the API): a sorted
    list of distinct seeds from 0 to 2^31 - 1, at most ``MAX_SEEDS`` of them."""

    widget = SeedsInput
    PART = re.compile(r"^(\d{1,10})(?:-(\d{1,10}))?$")

    def to_python(self, value: Any) -> list[int]:
        parts = value if isinstance(value, list | tuple) else re.split(r"[,\s]+", str(value or "").strip())
        seeds: set[int] = set()
        for part in (str(p).strip() for p in parts):
            if not part:
                continue
            m = self.PART.match(part) if part.isascii() else None
            if m is None:
                raise forms.ValidationError(
                    f"write seeds as numbers and ranges, e.g. 0-4 or 0, 2, 7 (got {part!r})"
                )
            low, high = int(m[1]), int(m[2] or m[1])
            if high < low or high > 2**31 - 1:
                raise forms.ValidationError(f"{part}: a range runs up from its first seed, below 2^31")
            if high - low >= MAX_SEEDS:
                raise forms.ValidationError(f"{part}: at most {MAX_SEEDS} seeds in one experiment")
            seeds.update(range(low, high + 1))
            if len(seeds) > MAX_SEEDS:
                raise forms.ValidationError(f"at most {MAX_SEEDS} seeds in one experiment")
        return sorted(seeds)


class LaunchForm(forms.Form):
    """A new run: environment, method, ablations, models and the hyper-parameters people change."""

    template = forms.ChoiceField(required=False, label="Start from a template")
    """A config file that fills the form (only fills it: what launches is what the form then says)."""
    name = forms.CharField(
        max_length=150,
        required=False,
        validators=[no_hidden_characters],
        help_text="Default: method and environment.",
    )
    preset = forms.ChoiceField(choices=[(p, p) for p in PRESETS], initial="cpu")
    env = forms.ChoiceField(label="Environment or mixture")
    method = forms.ChoiceField(choices=[(m, m) for m in METHODS])
    no_split = forms.BooleanField(required=False, label="No split (all rollouts guided)")
    cross_group = forms.BooleanField(required=False, label="Cross-group normalisation")
    no_merge = forms.BooleanField(required=False, label="No merge")
    no_search_and_ask = forms.BooleanField(required=False, label="No Search-and-Ask")
    no_diversification = forms.BooleanField(required=False, label="No diversification")
    no_reweighting = forms.BooleanField(required=False, label="No reweighting")
    actor_model = forms.CharField(max_length=500, label="Actor model")
    extractor_model = forms.CharField(max_length=500, label="Extractor model")
    k_rollouts = IntegerField(label="K (rollouts per task)")
    tasks_per_step = IntegerField(label="Tasks per step (batch)")
    steps = IntegerField()
    actor_lr = FloatField(label="Actor learning rate")
    extractor_lr = FloatField(label="Extractor learning rate")
    turn_limit = IntegerField(required=False, help_text="Empty: each environment's own limit.")
    seed = IntegerField(label="First seed")
    n_seeds = IntegerField(label="Seeds to launch", initial=1, min_value=1, max_value=MAX_SEEDS)
    eval_every = IntegerField(label="Eval every (steps)")
    nproc = IntegerField(
        required=False,
        label="Processes (devices)",
        help_text="One per GPU (FSDP2 over them), or CPU processes sharing this machine; the run goes to a "
        "worker that has them.",
    )
    overrides = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        help_text="More settings, one dotted key=value per line, e.g. rollout.max_new_tokens=64.",
    )
    tags = forms.CharField(max_length=300, required=False, help_text="Comma separated.")
    shared = forms.BooleanField(required=False, help_text="Let every user see this run.")
    base = forms.CharField(widget=forms.HiddenInput)
    submission = forms.CharField(
        widget=forms.HiddenInput, required=False, max_length=64, validators=[RegexValidator(r"^[0-9a-f]*$")]
    )
    """A token made when the form is shown: the same submission posted twice launches once."""
    experiment = forms.SlugField(
        max_length=80,
        required=False,
        validators=[no_hidden_characters],
        label="Experiment name",
        help_text="Set a name to launch a grid instead of one run: every method below × every seed below, "
        "all on this form's config and budget.",
    )
    experiment_methods = forms.MultipleChoiceField(
        required=False,
        label="Methods",
        choices=[(m, m) for m in METHODS],
        widget=forms.CheckboxSelectMultiple,
    )
    experiment_seeds = SeedListField(
        required=False, label="Seeds", help_text=f"e.g. 0-4 or 0, 2, 7; at most {MAX_SEEDS} seeds."
    )

    def _in_form_words(self, message: str) -> str:
        """A config error about a field of this form in its words: each config key it has a field for, by
        the field's label ("K (rollouts per task) must be even", not "k_rollouts must be even")."""
        for name, key in sorted(CONFIG_FIELDS.items(), key=lambda kv: -len(kv[1])):
            label = self.fields[name].label or pretty_name(name)
            message = re.sub(rf"(?<![\w.']){re.escape(key)}(?![\w.'])", label, message)
        return message

    def __init__(self, *args: Any, by_label: bool = True, **kwargs: Any) -> None:
        """``by_label``: a config error names a setting by its field's label (the page), else by its key
        (the API)."""
        super().__init__(*args, **kwargs)
        self.by_label = by_label
        self.fields["env"].choices = env_choices()
        self.templates = config_templates()
        self.fields["template"].choices = [("", "none: the preset's values")] + [
            (t.name, f"configs/{t.name}") for t in self.templates
        ]
        if not self.is_bound:
            self.initial.setdefault("submission", uuid.uuid4().hex)
        self.config: RunConfig | None = None
        self.spec: ExperimentSpec | None = None

    def clean_actor_model(self) -> str:
        return clean_model_path(self.cleaned_data["actor_model"])

    def clean_extractor_model(self) -> str:
        return clean_model_path(self.cleaned_data["extractor_model"])

    def clean_tags(self) -> list[str]:
        tags = [t.strip() for t in self.cleaned_data["tags"].split(",") if t.strip()]
        for tag in tags:
            try:
                no_hidden_characters(tag)
            except forms.ValidationError as err:
                raise forms.ValidationError(f"the tag {shown(tag)!r} {err.messages[0]}") from None
        return tags

    def clean_base(self) -> dict[str, Any]:
        if len(self.cleaned_data["base"]) > 100_000:
            raise forms.ValidationError("the base config is too large; reload the form")
        try:
            base = json.loads(self.cleaned_data["base"])
        except (json.JSONDecodeError, RecursionError):
            raise forms.ValidationError("the base config is not valid JSON; reload the form") from None
        if not isinstance(base, dict):
            raise forms.ValidationError("the base config must be a table of keys; reload the form")
        return base

    def clean_overrides(self) -> dict[str, str]:
        out = {}
        for number, line in enumerate(self.cleaned_data["overrides"].splitlines(), 1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(f"line {number}: write key=value (got {line.strip()!r})")
            key = key.strip()
            if key in CONFIG_FIELDS.values():
                field = next(n for n, k in CONFIG_FIELDS.items() if k == key)
                label = self.fields[field].label or field.replace("_", " ")
                raise forms.ValidationError(f"line {number}: {key} has its own field ({label}); set it there")
            out[key] = value.strip()
        return out

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        values = {
            key: data[name]
            for name, key in CONFIG_FIELDS.items()
            if not (name in OPTIONAL_FIELDS and data[name] is None)
        }
        try:
            config = RunConfig.from_dict(data["base"])
            config = config.with_overrides(**values, **data["overrides"])
        except ConfigError as err:
            field = _field_for(str(err))
            if field is None and any(str(err).find(repr(k)) >= 0 for k in data["overrides"]):
                field = "overrides"
            worded = self.by_label and field in CONFIG_FIELDS
            self.add_error(field, self._in_form_words(str(err)) if worded else str(err))
            return data
        last_seed = config.seed + data["n_seeds"] - 1
        if last_seed > 2**31 - 1:
            self.add_error("seed", "the seeds must stay below 2^31")
        self.config = config
        if data.get("experiment"):
            self.spec = self._experiment_spec(config, data)
        return data

    def submission_token(self) -> str:
        """The submission token if its own field accepts it, else "" (whether or not the rest is valid: a
        copy of a submission that launched leads to what it launched; a malformed token is the form's error
        to name, never a database lookup)."""
        try:
            return self.fields["submission"].clean(self.data.get("submission", ""))
        except forms.ValidationError:
            return ""

    def launch_arguments(self) -> dict[str, Any]:
        """A valid form's launch as ``webapp.services.run_launch`` takes it: the checked config, the grid
        (an experiment), and how its runs are named, tagged, shared and seeded."""
        data = self.cleaned_data
        return {
            "config": self.config,
            "spec": self.spec,
            "name": data["name"],
            "tags": data["tags"],
            "shared": data["shared"],
            "n_seeds": data["n_seeds"],
            "launch_token": data["submission"],
        }

    def _experiment_spec(self, config: RunConfig, data: dict[str, Any]) -> ExperimentSpec | None:
        """The grid this form launches: the form's config as the base, its budget shared by every cell."""
        name = data["experiment"]
        if not data["experiment_methods"]:
            self.add_error("experiment_methods", "choose at least one method for the experiment")
        if not data["experiment_seeds"]:
            self.add_error("experiment_seeds", "choose at least one seed for the experiment")
        if self.errors:
            return None
        budget = {
            key: getattr(config, key)
            for key in ("steps", "tasks_per_step", "k_rollouts", "eval_every", "eval_episodes")
        }
        try:
            return ExperimentSpec.from_dict(
                {
                    "name": name,
                    "description": data["name"],
                    "base": config.to_dict(),
                    "budget": budget,
                    "methods": data["experiment_methods"],
                    "seeds": sorted(data["experiment_seeds"]),
                }
            )
        except ConfigError as err:
            self.add_error("experiment_methods", str(err))
            return None

    @classmethod
    def for_preset(cls, name: str) -> LaunchForm:
        return cls(initial=config_initial(get_preset(name)) | {"preset": name})

    @classmethod
    def for_template(cls, name: str, owner=None) -> LaunchForm:
        """The form filled from the template ``name`` for ``owner``; ConfigError if there is none or it is
        invalid."""
        return cls(initial=template_initial(template_start(name, owner)) | {"template": name})

    @property
    def chosen_template(self) -> ConfigTemplate | None:
        name = self["template"].value()
        return next((t for t in self.templates if t.name == name), None)


class RunFilterForm(forms.Form):
    """The runs list's filters and sort order; anything invalid is ignored with a message."""

    q = forms.CharField(required=False, max_length=100, label="Search")
    status = forms.ChoiceField(
        required=False, choices=[("", "any status"), *Run.Status.choices, ("lost", "Lost")]
    )
    method = forms.ChoiceField(required=False, choices=[("", "any method"), *[(m, m) for m in METHODS]])
    env = forms.CharField(required=False, max_length=100, label="Environment")
    tag = forms.CharField(required=False, max_length=100)
    mine = forms.BooleanField(required=False, label="Only mine")
    sort = forms.ChoiceField(
        required=False,
        choices=[
            ("created", "newest"),
            ("oldest", "oldest"),
            ("name", "name"),
            ("step", "step"),
            ("status", "status"),
            ("success", "latest success"),
        ],
    )


class IdListField(forms.Field):
    """Repeated ``?runs=1&runs=2`` parameters as a list of distinct ints."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[int]:
        try:
            ids = list(dict.fromkeys(int(v) for v in value or []))
        except (TypeError, ValueError):
            raise forms.ValidationError("run ids must be whole numbers") from None
        if any(not 1 <= i <= ID_MAX for i in ids):
            raise forms.ValidationError(f"run ids are whole numbers from 1 to {ID_MAX}")
        return ids


class CommittedListField(forms.Field):
    """Repeated ``?committed=room-random/grpo-s0`` parameters: committed cells, distinct, in order."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[str]:
        refs = list(dict.fromkeys(str(v) for v in value or []))
        if len(refs) > 64 or any(len(r) > 200 or r.count("/") != 1 for r in refs):
            raise forms.ValidationError("a committed cell is <grid>/<cell folder>, e.g. room-random/grpo-s0")
        return refs


class MetricListField(forms.Field):
    """Repeated ``?metric=train:train/success`` parameters as ``(kind, key)`` pairs, in order."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[tuple[str, str]]:
        out = []
        for item in value or []:
            kind, sep, key = str(item).partition(":")
            if not sep or kind not in ("train", "eval") or not key:
                raise forms.ValidationError(f"a metric is kind:name, e.g. train:train/success (got {item!r})")
            out.append((kind, key))
        return list(dict.fromkeys(out))


class CompareForm(forms.Form):
    """Which runs to compare and how: the URL holds all of it, so it can be shared."""

    runs = IdListField(required=False)
    committed = CommittedListField(
        required=False,
        help_text="Committed cells, <grid>/<cell folder> (room-random/grpo-s0), drawn beside the runs.",
    )
    group = forms.CharField(
        required=False,
        max_length=100,
        help_text="'seeds', 'none', or a config key such as method; by default seeds of one experiment arm "
        "are grouped.",
    )
    metric = MetricListField(required=False)
    x = forms.ChoiceField(required=False, choices=[("step", "step"), ("wall", "wall time")])
    smooth = FloatField(required=False, min_value=0, max_value=0.99)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not data.get("runs") and not data.get("committed") and not self.errors:
            self.add_error("runs", "select at least one run to compare")
        return data


# ---- experience bank ---------------------------------------------------------------------------------


class BankSearchForm(forms.Form):
    """Search (semantic or full text) or browse a bank, sorted by usage, success when used, or recency."""

    q = forms.CharField(required=False, max_length=500, label="Search")
    mode = forms.ChoiceField(required=False, choices=[("semantic", "by meaning"), ("text", "full text")])
    scope = forms.CharField(required=False, max_length=100)
    sort = forms.ChoiceField(
        required=False,
        choices=[
            ("recent", "recently changed"),
            ("usage", "most retrieved"),
            ("success", "success when used"),
        ],
    )
    pinned = forms.BooleanField(required=False, label="Pinned only")


def _no_nul(text: str) -> None:
    if "\x00" in text:
        raise forms.ValidationError("the text contains a NUL character")


class ExperienceForm(forms.Form):
    """An entry's text; ``version`` is the one the person started from (a stale save is refused)."""

    title = forms.CharField(max_length=TITLE_MAX, validators=[_no_nul])
    content = forms.CharField(
        max_length=CONTENT_MAX, validators=[_no_nul], widget=forms.Textarea(attrs={"rows": 10})
    )
    version = IntegerField(
        widget=forms.HiddenInput,
        min_value=1,
        max_value=INT_MAX,
        error_messages={"required": "the form did not say which version of the entry you edited"},
    )


class PruneForm(forms.Form):
    """Bulk prune by rule: entries matching ALL (or ANY) criteria, pinned ones never. Preview first, then
    confirm: the confirmation carries the previewed ids, and exactly those are deleted."""

    combine = forms.ChoiceField(
        choices=[("all", "all of the criteria (each one narrows)"), ("any", "any one of the criteria")],
        initial="all", required=False, label="Delete entries matching",
    )  # fmt: skip
    never_retrieved = forms.BooleanField(required=False, label="Never retrieved")
    success_rate_below = FloatField(
        required=False, min_value=0, max_value=1, label="Success rate when used below"
    )
    min_guided = IntegerField(
        required=False, min_value=1, max_value=INT_MAX, initial=1,
        label="…over at least this many guided episodes",
    )  # fmt: skip
    older_than_step = IntegerField(
        required=False, min_value=0, max_value=INT_MAX, label="Last changed before step"
    )
    scope = forms.CharField(required=False, max_length=100)
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)
    ids = forms.CharField(required=False, widget=forms.HiddenInput, validators=[RegexValidator(r"^[0-9,]*$")])

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not self.errors and not (
            data.get("never_retrieved")
            or data.get("success_rate_below") is not None
            or data.get("older_than_step") is not None
        ):
            raise forms.ValidationError("choose at least one rule: never retrieved, success rate or age")
        return data

    def rule(self) -> PruneRule:
        data = self.cleaned_data
        return PruneRule(
            never_retrieved=data["never_retrieved"],
            success_rate_below=data["success_rate_below"],
            min_guided=data["min_guided"] or 1,
            older_than_step=data["older_than_step"],
            scope=data["scope"] or None,
            combine=data["combine"] or "all",
        )

    def clean_ids(self) -> list[int]:
        ids = [int(i) for i in self.cleaned_data["ids"].split(",") if i]
        if any(i > ID_MAX for i in ids):
            raise forms.ValidationError("the previewed entries' ids are not valid; preview the prune again")
        return ids

    def confirmed_ids(self) -> list[int]:
        return self.cleaned_data["ids"]


class ImportForm(forms.Form):
    file = forms.FileField(label="JSONL export")

    def clean_file(self) -> Any:
        upload = self.cleaned_data["file"]
        if upload.size > FILE_MAX_BYTES:
            raise forms.ValidationError(f"the file is larger than {FILE_MAX_BYTES // 2**20} MB")
        return upload
