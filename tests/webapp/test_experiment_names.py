"""Experiment names are unique per owner: each user names experiments in a namespace of their own, a launch
never learns that another user's private experiment exists, and two grids of one name never share a folder."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from trainer.config import get_preset
from trainer.experiments.spec import ExperimentSpec
from webapp.experiments import cell_dir, experiment_cells, experiment_sync, results_dir
from webapp.forms import LaunchForm
from webapp.models import Experiment, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def launchers(user, other_user):
    perm = Permission.objects.get(codename="launch_run", content_type__app_label="webapp")
    for person in (user, other_user):
        person.user_permissions.add(perm)
    return user, other_user


@pytest.fixture
def results(tmp_path, settings):
    settings.EXPERIMENT_RESULTS_DIR = tmp_path / "results"
    return tmp_path / "results"


def _grid(name: str = "grid", **changes) -> dict:
    cfg = get_preset("cpu")
    data = {
        "name": "a grid", "preset": "cpu", "env": cfg.env, "method": cfg.method,
        "actor_model": cfg.actor.model_path, "extractor_model": cfg.extractor.model_path,
        "k_rollouts": cfg.k_rollouts, "tasks_per_step": cfg.tasks_per_step, "steps": 1,
        "actor_lr": cfg.actor.lr, "extractor_lr": cfg.extractor.lr, "turn_limit": 8, "seed": 0,
        "n_seeds": 1, "eval_every": 0, "overrides": "", "tags": "", "base": json.dumps(cfg.to_dict()),
        "experiment": name, "experiment_methods": ["grpo"], "experiment_seeds": ["0"],
    }  # fmt: skip
    return data | changes


def _spec(name: str = "grid", **fields) -> ExperimentSpec:
    return ExperimentSpec.from_dict(
        {"name": name, "base": "cpu", "methods": ["grpo"], "seeds": [0], **fields}
    )


def _launch(client, person, **changes):
    client.force_login(person)
    return client.post(reverse("run_launch"), _grid(**changes))


def test_a_launch_may_reuse_another_users_private_experiment_name_without_learning_of_it(
    client, launchers, results, monkeypatch
):
    alice, bob = launchers
    monkeypatch.setattr("webapp.queueing._enqueue", lambda run_id: None)
    assert _launch(client, alice).status_code == 302
    response = _launch(client, bob)
    assert response.status_code == 302 and response["Location"] == reverse("experiment_detail", args=["grid"])
    mine, theirs = Experiment.objects.get(owner=alice), Experiment.objects.get(owner=bob)
    assert (mine.name, theirs.name) == ("grid", "grid")
    assert mine.folder == "grid" and theirs.folder == f"grid--{bob.pk}"
    runs = {r.owner: r for r in Run.objects.filter(experiment__isnull=False)}
    assert runs[alice].checkpoint_dir != runs[bob].checkpoint_dir
    assert runs[bob].checkpoint_dir.endswith(f"grid--{bob.pk}/grpo-s0")


def test_a_launch_refuses_only_the_launchers_own_experiment_name(client, launchers, results, monkeypatch):
    alice, _ = launchers
    monkeypatch.setattr("webapp.queueing._enqueue", lambda run_id: None)
    _launch(client, alice)
    again = _launch(client, alice)
    page = again.content.decode()
    assert again.status_code == 400 and "you have an experiment called &#x27;grid&#x27; already" in page
    assert Experiment.objects.count() == 1 and Run.objects.count() == 1


def test_an_experiment_page_by_name_shows_the_viewers_own_then_a_shared_one(client, user, other_user):
    theirs = Experiment.objects.create(name="grid", owner=other_user, shared=True, description="bob's grid")
    client.force_login(user)
    assert "bob&#x27;s grid" in client.get(reverse("experiment_detail", args=["grid"])).content.decode()
    Experiment.objects.create(name="grid", owner=user, shared=False, description="alice's grid", folder="g2")
    own = client.get(reverse("experiment_detail", args=["grid"])).content.decode()
    assert "alice&#x27;s grid" in own
    picked = client.get(reverse("experiment_detail", args=["grid"]), {"owner": other_user.username})
    assert "bob&#x27;s grid" in picked.content.decode()
    listed = client.get(reverse("experiments")).content.decode()
    assert theirs.get_absolute_url() in listed and "?owner=alice" in listed


def test_another_users_private_experiment_is_not_found_by_name_or_owner(client, user, other_user):
    Experiment.objects.create(name="secret", owner=other_user, shared=False)
    client.force_login(user)
    assert client.get(reverse("experiment_detail", args=["secret"])).status_code == 404
    query = {"owner": other_user.username}
    assert client.get(reverse("experiment_detail", args=["secret"]), query).status_code == 404
    assert (
        client.get(reverse("experiment_report_file", args=["secret", "report.md"]), query).status_code == 404
    )


def test_the_report_of_a_second_grid_of_a_name_is_read_from_its_own_folder(client, user, other_user, results):
    experiment_sync(_spec(), other_user)
    second = experiment_sync(_spec(), user)
    (results_dir(second.folder) / "report").mkdir(parents=True)
    (results_dir(second.folder) / "report" / "report.md").write_text("# alice's own report\n")
    client.force_login(user)
    page = client.get(reverse("experiment_detail", args=["grid"])).content.decode()
    assert "<h1>alice's own report</h1>" in page
    report = client.get(reverse("experiment_report_file", args=["grid", "report.md"]), {"owner": "alice"})
    assert report.status_code == 200 and b"alice's own report" in b"".join(report.streaming_content)


def test_committed_results_count_for_the_grid_that_owns_the_folder_only(user, other_user, results):
    spec = _spec()
    first, second = experiment_sync(spec, user), experiment_sync(spec, other_user)
    cell = spec.cells()[0]
    folder = results_dir(first.folder) / "runs" / cell.slug
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"status": "succeeded"}))
    (folder / "config.json").write_text(json.dumps(cell.config.to_dict()))
    assert [s.committed for s in experiment_cells(first, spec)] == [folder]
    assert [s.committed for s in experiment_cells(second, spec)] == [None]
    assert cell_dir(first.folder, cell) != cell_dir(second.folder, cell)


def test_running_an_experiment_file_again_updates_the_owners_own_row(user, other_user, results):
    experiment_sync(_spec(), other_user)
    first = experiment_sync(_spec(), user)
    again = experiment_sync(_spec(description="new"), user)
    assert again.pk == first.pk and again.description == "new" and Experiment.objects.count() == 2


def test_a_template_suggests_a_name_free_among_the_users_own_experiments(user, other_user):
    form = LaunchForm.for_template("experiments/room-random.toml", user)
    name = form.initial["experiment"]
    Experiment.objects.create(name=name, owner=other_user)
    assert LaunchForm.for_template("experiments/room-random.toml", user).initial["experiment"] == name
    Experiment.objects.create(name=name, owner=user, folder=f"{name}-mine")
    assert LaunchForm.for_template("experiments/room-random.toml", user).initial["experiment"] == f"{name}-2"
