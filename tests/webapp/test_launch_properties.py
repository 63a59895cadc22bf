"""Property-based: random and hostile launch form values (fields, overrides, the hidden base config) never
give a server error, and a refused launch changes nothing in the database."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.config import RunConfig, get_preset
from webapp.models import Run

pytestmark = pytest.mark.django_db
SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

DEFAULTS = RunConfig().to_dict()
DOTTED = [k for k, v in DEFAULTS.items() if not isinstance(v, dict)] + [
    f"{s}.{k}" for s, v in DEFAULTS.items() if isinstance(v, dict) for k in v
]
hostile = st.one_of(
    st.text(max_size=30), st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats().map(str), st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["nan", "inf", "-inf", "1e309", "0", "-1", "", "\x00", "../../etc/passwd", "/nonexistent",
                     "²", "[" * 200, "{" * 2000, '{"actor": {"lr": 1e999}}', "true"]),
)  # fmt: skip
override_lines = st.lists(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(DOTTED) | st.text(max_size=10), hostile), max_size=4
).map("\n".join)
FIELDS = ["name", "preset", "env", "method", "actor_model", "extractor_model", "k_rollouts", "tasks_per_step",
          "steps", "actor_lr", "extractor_lr", "turn_limit", "seed", "n_seeds", "eval_every", "tags", "base",
          "shared", "template", "submission", "experiment"]  # fmt: skip


def _valid() -> dict:
    cfg = get_preset("cpu")
    return {
        "name": "p", "preset": "cpu", "env": cfg.env, "method": cfg.method,
        "actor_model": cfg.actor.model_path, "extractor_model": cfg.extractor.model_path,
        "k_rollouts": cfg.k_rollouts,
        "tasks_per_step": cfg.tasks_per_step, "steps": 3, "actor_lr": cfg.actor.lr,
        "extractor_lr": cfg.extractor.lr, "turn_limit": 8, "seed": 5, "n_seeds": 1, "eval_every": 2,
        "overrides": "", "tags": "", "base": json.dumps(cfg.to_dict()),
    }  # fmt: skip


@pytest.fixture
def launcher_client(client, user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    client.force_login(user)
    return client


@SETTINGS
@given(st.dictionaries(st.sampled_from(FIELDS), hostile, max_size=4), override_lines)
def test_any_launch_form_is_launched_or_refused_with_nothing_changed(launcher_client, changes, overrides):
    before = Run.objects.count()
    response = launcher_client.post(reverse("run_launch"), _valid() | changes | {"overrides": overrides})
    assert response.status_code in (302, 400), response.status_code
    if response.status_code == 400:
        assert Run.objects.count() == before
        assert "errorlist" in response.content.decode() or "error" in response.content.decode()
    else:  # launched (or, for a repeated submission token, led to what that submission launched)
        assert Run.objects.count() >= before
