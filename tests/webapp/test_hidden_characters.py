"""Run names, tags and experiment names refuse control, invisible and direction-changing characters with a
message naming the character: one validator for every such field (the API binds the same launch form)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.forms import ValidationError
from django.urls import reverse

from trainer.config import get_preset
from webapp.forms import no_hidden_characters
from webapp.models import Run

HIDDEN = ["\u202e", "\u202a", "\u2066", "\u2069", "\u200e", "\u200f", "\u061c", "\u200b", "\u200d", "\u2060",
          "\ufeff", "\u2028", "\x00", "\x1b", "\t", "\r", "\n", "\x7f"]  # fmt: skip


@pytest.mark.parametrize("char", HIDDEN)
def test_the_validator_names_the_character_it_refuses(char):
    with pytest.raises(ValidationError) as refused:
        no_hidden_characters(f"best{char}run")
    message = refused.value.messages[0]
    assert f"(U+{ord(char):04X}" in message and message.startswith("contains a")


def test_the_message_says_what_kind_of_character_it_is():
    with pytest.raises(
        ValidationError, match=r"invisible or direction-changing character \(U\+202E RIGHT-TO"
    ):
        no_hidden_characters("exe.\u202etxt")
    with pytest.raises(ValidationError, match=r"a control character \(U\+001B\)"):
        no_hidden_characters("a\x1b[31m")


@pytest.mark.parametrize("name", ["grpo on MiniHack", "Überlauf · seed 3", "实验 1", "تجربة", "🚀 run"])
def test_ordinary_names_in_any_script_pass(name):
    no_hidden_characters(name)


@pytest.fixture
def launcher(user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


def _launch_data(**changes) -> dict:
    cfg = get_preset("cpu")
    data = {
        "name": "my run", "preset": "cpu", "env": cfg.env, "method": cfg.method,
        "actor_model": cfg.actor.model_path, "extractor_model": cfg.extractor.model_path,
        "k_rollouts": cfg.k_rollouts, "tasks_per_step": cfg.tasks_per_step, "steps": 3,
        "actor_lr": cfg.actor.lr, "extractor_lr": cfg.extractor.lr, "turn_limit": 8, "seed": 5,
        "n_seeds": 1, "eval_every": 2, "overrides": "", "tags": "smoke", "base": json.dumps(cfg.to_dict()),
    }  # fmt: skip
    return data | changes


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"name": "invoice\u202egpj.exe"}, "(U+202E RIGHT-TO-LEFT OVERRIDE)"),
        ({"name": "zero\u200bwidth"}, "(U+200B ZERO WIDTH SPACE)"),
        ({"tags": "ok, bad\u2066tag"}, "the tag &#x27;bad&lt;U+2066&gt;tag&#x27; contains an invisible"),
        ({"experiment": "grid\ufeff", "experiment_methods": ["grpo"], "experiment_seeds": ["0"]}, "(U+FEFF"),
    ],
)
def test_a_launch_with_a_hidden_character_is_refused_next_to_its_field(client, launcher, changes, says):
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), _launch_data(**changes))
    assert response.status_code == 400 and says in response.content.decode()
    assert not Run.objects.exists()
