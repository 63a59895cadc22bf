"""Pages that say what happened and what to do next: a cancelled or failed run says what it kept and how to
go on (Resume only where a checkpoint exists), a dead training process is a sentence a person acts on, the
inspector's empty state fits the run's state, and a run's config shows what its method uses."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from experience.models import EMBEDDING_DIM, Experience
from trainer.config import get_preset
from webapp.models import EpisodeRecord, Run
from webapp.supervisor import MAX_RESTARTS, restart

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher(user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


def _run(owner, method="complementary", **fields) -> Run:
    config = get_preset("cpu").with_overrides(method=method).to_dict()
    return Run.objects.create(name="r", owner=owner, method=method, config=config, **fields)


def _checkpoint(folder, step: int) -> None:
    path = folder / "checkpoints" / f"step-{step:06d}"
    path.mkdir(parents=True)
    (path / "state.json").write_text("{}")


def _page(client, run) -> str:
    return client.get(reverse("run_detail", args=[run.id])).content.decode()


def test_a_cancelled_run_with_a_checkpoint_says_what_it_kept_and_offers_resume(client, launcher, tmp_path):
    _checkpoint(tmp_path, 2)
    run = _run(launcher, status=Run.Status.CANCELLED, step=3, checkpoint_dir=str(tmp_path))
    EpisodeRecord.objects.create(run=run, step=1, task_instance=0, env="e", seed=0, guided=False,
                                 reward=0, success=False, num_actions=1)  # fmt: skip
    Experience.objects.create(run=run, title="t", content="c", embedding=[0.1] * EMBEDDING_DIM)
    client.force_login(launcher)
    page = _page(client, run)
    outcome = page.split('id="run-outcome"')[1].split("</div>")[0]
    assert "Cancelled at step 3" in outcome and "1 episode," in outcome and "1 bank entry" in outcome
    assert "checkpoint of step 2" in outcome and "continues from step 2" in outcome
    assert "Resume from checkpoint</button>" in page and "Clone this run" in outcome


def test_a_cancelled_run_without_a_checkpoint_offers_only_a_clone(client, launcher, tmp_path):
    run = _run(launcher, status=Run.Status.CANCELLED, step=0, checkpoint_dir=str(tmp_path))
    client.force_login(launcher)
    page = _page(client, run)
    outcome = page.split('id="run-outcome"')[1].split("</div>")[0]
    assert "no checkpoint (the first is written at step" in outcome and "Resume" not in outcome
    assert "Resume from checkpoint</button>" not in page and "Clone this run</strong> starts again" in outcome


def test_running_and_finished_runs_have_no_outcome_note(client, user):
    client.force_login(user)
    for status in (Run.Status.RUNNING, Run.Status.SUCCEEDED, Run.Status.QUEUED):
        assert 'id="run-outcome"' not in _page(client, _run(user, status=status))


def test_a_training_process_killed_for_the_last_time_fails_the_run_with_a_cause_and_a_next_step(user):
    run = _run(user, status=Run.Status.RUNNING, step=4, restarts=MAX_RESTARTS)
    assert restart(run, -9) is False
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "died killed" not in run.error and "ran out of memory" in run.error
    assert "at step 4" in run.error and "Resume from checkpoint" in run.error
    assert "tasks_per_step" in run.error


def test_a_restart_notice_reads_as_a_sentence(user):
    run = _run(user, status=Run.Status.RUNNING, step=2)
    assert restart(run, 1) is True
    run.refresh_from_db()
    assert run.notice.startswith(
        "The training process exited with code 1 at step 2; it was resumed from the last checkpoint"
    )


def test_a_cancel_that_ended_the_process_uncleanly_reads_as_a_cancel_not_a_failure(client, user):
    run = _run(user, status=Run.Status.RUNNING, step=3, cancel_requested=True)
    assert restart(run, 1) is False
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.error == "" and run.finished_at
    assert run.notice == "Cancelled as requested (the training process exited with code 1)."
    client.force_login(user)
    page = _page(client, run)
    assert 'id="run-error"' not in page and "Cancelled as requested" in page and "Cancelled at step 3" in page


@pytest.mark.parametrize(
    ("status", "words"),
    [("queued", "is queued"), ("running", "No step has finished yet"), ("cancelled", "was cancelled before")],
)
def test_the_inspectors_empty_state_fits_the_runs_state(client, user, status, words):
    client.force_login(user)
    page = client.get(reverse("run_inspect", args=[_run(user, status=status).id])).content.decode()
    assert words in page.split('id="no-episodes"')[1].split("</p>")[0]
    assert "No episodes recorded for this run yet" not in page


def test_a_grpo_runs_config_leaves_out_the_extractor_and_bank_settings(client, user):
    client.force_login(user)
    grpo = _page(client, _run(user, method="grpo")).split('id="config-rows"')[1].split("</table>")[0]
    assert "actor.lr" in grpo and "k_rollouts" in grpo
    assert "extractor." not in grpo and "experience." not in grpo and "no_merge" not in grpo
    complementary = _page(client, _run(user)).split('id="config-rows"')[1].split("</table>")[0]
    assert "extractor.lr" in complementary and "experience.top_k" in complementary
    assert "grpo never retrieves experience" in _page(client, _run(user, method="grpo"))
