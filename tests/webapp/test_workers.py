"""The workers `manage.py up` starts: one per queue, so light work never waits behind training runs."""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from experience import transfer
from experience.models import ImportJob
from experience.services import import_job_start
from experience.tasks import import_bank
from tests.conftest import wait_for, workers_running
from trainer.config import get_preset
from webapp.celery import app
from webapp.management.commands.up import worker_commands
from webapp.models import Run
from webapp.services import run_cancel
from webapp.tasks import train_run
from webapp.training import run_dir

pytestmark = pytest.mark.django_db(transaction=True)

# Runs that keep a slot busy for minutes at the least cost: the HF engine (no engine process to start),
# short turns, no checkpoints; they are cancelled once the import has started.
BUSY = {"method": "grpo", "steps": 100, "tasks_per_step": 1, "k_rollouts": 2, "eval_every": 0,
        "checkpoint_every": 0, "rollout.engine": "hf", "rollout.turn_limit": 2,
        "rollout.max_new_tokens": 8}  # fmt: skip


def test_only_training_runs_go_to_the_training_queue_and_every_other_task_to_default():
    app.loader.import_default_modules()  # registers every task module, as a worker does
    names = [name for name in app.tasks if not name.startswith("celery.")]
    queues = {
        name: app.amqp.router.route({}, name, task_type=app.tasks[name])["queue"].name for name in names
    }
    assert queues.pop(train_run.name) == "training"
    assert import_bank.name in queues and set(queues.values()) == {"default"}, queues


@pytest.fixture
def up_workers(settings):
    """The training and the light worker as `manage.py up` starts them (two slots each), on queues of
    their own: ``{"training": queue, "default": queue}``."""
    settings.STUDIO_WORKER_CONCURRENCY = settings.STUDIO_LIGHT_WORKER_CONCURRENCY = 2
    prefix = f"test-{uuid.uuid4().hex[:8]}-"
    with workers_running(list(worker_commands(sys.executable, prefix=prefix).values())):
        yield {"training": f"{prefix}training", "default": f"{prefix}default"}


@pytest.fixture
def busy_runs(user, up_workers):
    """Two runs training on the training worker, one in each of its slots; cancelled at the end."""
    cfg = get_preset("cpu").with_overrides(**BUSY).to_dict()
    runs = [
        Run.objects.create(name=f"busy {i}", owner=user, method=cfg["method"], env=cfg["env"], config=cfg)
        for i in range(2)
    ]
    ids = [run.pk for run in runs]
    for run in runs:
        train_run.apply_async(args=[run.pk], queue=up_workers["training"])
    yield Run.objects.filter(pk__in=ids)
    for run in Run.objects.filter(pk__in=ids).active():
        run_cancel(run)
    wait_for(lambda: not Run.objects.filter(pk__in=ids).active().exists(), 120, "the runs to stop")
    for run in runs:
        shutil.rmtree(run_dir(run), ignore_errors=True)


def _upload() -> SimpleUploadedFile:
    lines = [
        {
            "format": transfer.FORMAT,
            "scope": "MiniHack",
            "title": f"Lesson {i}",
            "content": f"Walk around the boulder number {i} and then take the stairs.",
        }  # fmt: skip
        for i in range(3)
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return SimpleUploadedFile("bank.jsonl", body, content_type="application/jsonl")


def test_an_import_starts_within_30_s_while_two_runs_hold_both_training_slots(
    user, up_workers, busy_runs, django_capture_on_commit_callbacks
):
    running = busy_runs.filter(status=Run.Status.RUNNING)
    wait_for(lambda: running.count() == 2, 120, "both runs to be claimed")

    bank = Run.objects.create(name="bank", owner=user, method="complementary")
    with django_capture_on_commit_callbacks(execute=False):  # queued below, on this test's light queue
        job = import_job_start(bank, _upload(), user=user)
    queued = time.monotonic()
    result = import_bank.apply_async(args=[job.pk], queue=up_workers["default"])
    started = ImportJob.objects.filter(pk=job.pk).exclude(status=ImportJob.Status.QUEUED)
    wait_for(started.exists, 30, "the import to start")
    print(f"the import started {time.monotonic() - queued:.1f} s after it was queued")
    assert running.count() == 2  # both training slots were busy all along
    assert result.get(timeout=180) == ImportJob.Status.SUCCEEDED
    assert bank.experiences.count() == 3


def test_a_training_process_runs_at_a_lower_cpu_priority_than_its_worker(settings):
    """Pages and light work get the cores first on a machine that also trains (``STUDIO_TRAINING_NICE``)."""
    import os
    import subprocess

    from webapp.supervisor import _die_with_parent

    settings.STUDIO_TRAINING_NICE = 7
    child = subprocess.run(  # noqa: PLW1509 - the supervisor's own preexec function, as it starts a run
        [sys.executable, "-c", "import os; print(os.nice(0))"],
        preexec_fn=_die_with_parent, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert int(child.stdout) == min(os.nice(0) + 7, 19)
