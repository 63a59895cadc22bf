"""The launch form's templates: every config file in configs/ and configs/experiments/, with its leading
comment as help text; picking one fills the form (the page swaps the form through htmx)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from trainer.config import RunConfig
from trainer.experiments.spec import ExperimentSpec
from webapp.forms import seed_ranges
from webapp.models import Experiment
from webapp.selectors import config_templates, configs_dir, leading_comment

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher(client, user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    client.force_login(user)
    return user


def _value(page: str, name: str) -> str:
    return re.search(rf'name="{name}"[^>]*value="([^"]*)"', page).group(1)


def test_every_config_file_is_a_template_with_its_leading_comment():
    root = configs_dir()
    files = sorted(
        str(p.relative_to(root)) for p in [*root.glob("*"), *root.glob("experiments/*")]
        if p.suffix in (".toml", ".json")
    )  # fmt: skip
    templates = {t.name: t for t in config_templates()}
    assert sorted(templates) == files and "cpu-room-random-grpo.toml" in files
    assert "experiments/room-random.toml" in files
    assert templates["cpu-room-random-grpo.toml"].help.startswith("GRPO on MiniHack-Room-Random-5x5")
    assert templates["experiments/room-random.toml"].experiment
    assert leading_comment("# one\n#   indented\n#\nkey = 1\n# not this") == "one\n  indented"


def test_the_form_lists_the_templates_and_a_run_config_fills_it(client, launcher):
    page = client.get(reverse("run_launch")).content.decode()
    assert 'id="id_template"' in page and "configs/experiments/room-5x5.toml" in page
    assert "hx-get" in page[page.index('id="id_template"') - 200 :]
    response = client.get(
        reverse("run_launch"), {"template": "cpu-room-random-grpo.toml"}, headers={"HX-Request": "true"}
    )
    page = response.content.decode()
    config = RunConfig.from_file(configs_dir() / "cpu-room-random-grpo.toml")
    assert page.startswith('<form id="launch-form"') and 'id="template-help"' in page
    assert "GRPO on MiniHack-Room-Random-5x5 with the cpu preset" in page
    assert _value(page, "steps") == "30" and _value(page, "tasks_per_step") == "4"
    assert _value(page, "actor_lr") == str(config.actor.lr)
    assert '<option value="MiniHack-Room-Random-5x5" selected>' in page
    assert '<option value="grpo" selected>' in page
    assert "&quot;max_new_tokens&quot;: 8" in page  # keys without a field travel in the base config


def test_an_experiment_template_fills_the_grid_fields_with_a_free_name(client, launcher):
    spec = ExperimentSpec.from_file(configs_dir() / "experiments" / "room-random.toml")
    Experiment.objects.create(name=spec.name, owner=launcher)
    page = client.get(reverse("run_launch"), {"template": "experiments/room-random.toml"}).content.decode()
    assert _value(page, "experiment") == f"{spec.name}-2" and _value(page, "steps") == "20"
    for method in spec.methods:
        assert re.search(rf'value="{method}"[^>]*checked', page), method
    assert _value(page, "experiment_seeds") == seed_ranges(list(spec.seeds))
    assert "Its variants (static_online+curated) launch with" in page
    assert "manage.py experiment run configs/experiments/room-random.toml" in page
    page = client.get(reverse("run_launch"), {"template": "experiments/room-5x5.toml"}).content.decode()
    assert 'id="template-note"' in page and "Its variants" not in page


def test_an_unknown_template_is_refused_with_a_message(client, launcher):
    page = client.get(reverse("run_launch"), {"template": "../../etc/passwd"}, follow=True).content.decode()
    assert "no template" in page and _value(page, "steps") == "20"  # the cpu preset's form
