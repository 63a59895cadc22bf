"""Workers register their devices; a launch goes to a worker whose devices fit its plan, never to one with
fewer devices than it asks for. Workers are described as STUDIO_WORKER_DEVICES would describe them (data),
and one real Celery worker registers itself and refuses a run that does not fit it."""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import replace

import pytest
from celery.exceptions import Retry
from django.core.management import CommandError, call_command

from tests.conftest import wait_for, workers_running
from trainer.config import RunConfig, get_preset
from trainer.plan import Devices, PlanError
from webapp.celery import app
from webapp.models import MetricRow, Run
from webapp.queueing import run_admission, run_hand_on
from webapp.tasks import train_run
from webapp.workers import (
    DEVICES_ENV,
    REGISTRY_ENV,
    TRAINING_QUEUE,
    Worker,
    _redis,
    configured_devices,
    live_workers,
    place,
    plan_display,
    plan_summary,
    planned_bytes,
    register,
    registry_key,
    stand_in,
    unregister,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def registry_of_its_own(monkeypatch):
    """A worker registry (Redis key) for this test alone, and no STUDIO_WORKER_DEVICES unless it sets one."""
    monkeypatch.setenv(REGISTRY_ENV, f"test-registry-{uuid.uuid4().hex}")
    monkeypatch.delenv(DEVICES_ENV, raising=False)
    yield registry_key()
    with _redis() as client:
        client.delete(registry_key())


def worker(node: str, devices: str, *, cores: int = 16, slots: int = 1) -> Worker:
    """A training worker of the shared queue, described as STUDIO_WORKER_DEVICES would describe it."""
    return Worker(node, TRAINING_QUEUE, Devices.parse(devices), slots, cores, DEVICES_ENV)


CPU_BOX, ONE_GPU, NODE = worker("cpu@a", "cpu:64GB"), worker("gpu1@b", "1x141GB"), worker("node@c", "8x80GB")


def test_a_registered_worker_is_live_until_its_record_goes_stale():
    register(CPU_BOX)
    register(NODE)
    assert [(w.node, w.devices) for w in live_workers()] == [
        ("cpu@a", CPU_BOX.devices),
        ("node@c", NODE.devices),
    ]
    stale = replace(CPU_BOX, node="old@d", seen=time.time() - 120)  # refreshed two minutes ago: gone
    with _redis() as client:
        client.hset(registry_key(), "old@d", stale.to_json())
        assert [w.node for w in live_workers()] == ["cpu@a", "node@c"]
        assert not client.hexists(registry_key(), "old@d")  # cleaned away
    unregister("node@c")
    assert [w.node for w in live_workers()] == ["cpu@a"]


def test_worker_devices_come_from_the_setting_or_this_machine(monkeypatch):
    assert configured_devices() is None and stand_in().devices == Devices.this_machine()
    monkeypatch.setenv(DEVICES_ENV, "2x80GB")
    assert stand_in().devices == Devices("cuda", 80 * 10**9, 2) and stand_in().source == DEVICES_ENV
    monkeypatch.setenv(DEVICES_ENV, "two big GPUs")
    with pytest.raises(PlanError, match="STUDIO_WORKER_DEVICES: devices must read like 8x80GB"):
        configured_devices()


def test_a_launch_every_worker_can_run_goes_to_the_shared_queue():
    placement = place(get_preset("cpu"), workers=[CPU_BOX, ONE_GPU])
    assert placement.queue == TRAINING_QUEUE and placement.refusal is None
    assert all(c.fits for c in placement.checks)


def test_a_launch_only_some_workers_can_run_goes_to_one_of_them_and_never_to_one_with_fewer_devices():
    cfg = get_preset("cpu").with_overrides(nproc=4, device="cuda", method="grpo")
    placement = place(cfg, workers=[CPU_BOX, ONE_GPU, NODE])
    assert placement.queue == NODE.queue == "node@c.training"
    why = {c.worker.node: c.why_not for c in placement.checks}
    assert "asks for CUDA devices" in why["cpu@a"]
    assert "it needs 4 devices, the worker has 1" in why["gpu1@b"]
    assert why["node@c"] is None
    # the smallest worker that fits is picked: big machines stay free for big runs
    two, cpu_grpo = worker("gpu2@e", "2x80GB"), get_preset("cpu").with_overrides(method="grpo")
    assert (
        place(cpu_grpo.with_overrides(nproc=2, device="cuda"), workers=[NODE, two, ONE_GPU]).queue
        == two.queue
    )


def test_the_paper_preset_is_refused_by_one_gpu_with_the_plans_numbers_and_a_fix():
    refused = place(get_preset("paper"), workers=[CPU_BOX, ONE_GPU])
    assert refused.queue is None
    assert refused.refusal.startswith(
        "no worker can run this launch (2 workers checked, the largest gpu1@b: 1 × 141 GB): it needs "
    )
    peak = refused.plan.device_bytes()
    assert f"{peak / 1e9:,.1f} GB per device" in refused.refusal and "use preset 'cpu'" in refused.refusal


def test_processes_on_a_cpu_worker_share_its_memory_one_per_core():
    small = worker("cpu@f", "cpu:24GB", cores=2)
    two = place(get_preset("cpu").with_overrides(nproc=2), workers=[small]).chosen
    assert two.devices == Devices("cpu", 12 * 10**9, 2)
    three = place(get_preset("cpu").with_overrides(nproc=3), workers=[small])
    assert three.queue is None and "it asks for 3 processes; the worker has 2 CPU cores" in three.refusal


def test_with_no_worker_registered_this_machine_stands_in():
    placement = place(get_preset("cpu"))
    assert placement.stand_in and placement.queue == TRAINING_QUEUE
    assert placement.chosen.devices == Devices.this_machine()


def _queued_run(user, **changes) -> Run:
    cfg = get_preset("cpu").with_overrides(**changes).to_dict()
    return Run.objects.create(name="r", owner=user, method=cfg["method"], env=cfg["env"], config=cfg)


def test_a_worker_hands_on_a_run_its_devices_do_not_fit_and_fails_it_when_no_worker_can(user):
    register(ONE_GPU)
    register(NODE)
    run = _queued_run(user, nproc=4, device="cuda", method="grpo")
    assert run_hand_on(run, NODE.node) is None  # it fits there: train it
    try:
        assert run_hand_on(run, ONE_GPU.node) == f"handed on to {NODE.queue}"
        with _redis() as client:
            assert client.llen(NODE.queue) == 1  # the task waits on the node's own queue
    finally:
        with _redis() as client:
            client.delete(NODE.queue)
    unregister(NODE.node)
    assert run_hand_on(run, ONE_GPU.node) == Run.Status.FAILED
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and run.worker == "" and run.started_at is None
    assert run.error.startswith(
        "Refused by gpu1@b: no worker can run it: it needs 4 devices, the worker has 1"
    )


def test_a_worker_training_a_run_planned_at_19_gb_does_not_start_a_second_that_does_not_fit_beside_it(user):
    box, big = worker("cpu@d", "cpu:24GB", slots=2), worker("cpu@e", "cpu:64GB", slots=2)
    register(box)
    register(big)
    first, second = _queued_run(user), _queued_run(user)
    planned = planned_bytes(RunConfig.from_dict(first.config), box)
    assert 18e9 < planned <= 24e9 < 2 * planned  # each fits the box alone, not both together
    assert run_admission(first, box.node) is None and first.claim(f"{box.node}:101")

    assert run_admission(second, box.node) == (
        f"Waiting for memory on cpu@d: this run's planned peak of {planned / 1e9:.1f} GB does not fit beside "
        f"run {first.pk} (planned {planned / 1e9:.1f} GB) in its 24.0 GB; it starts when one of them ends."
    )
    second.refresh_from_db()
    assert second.status == Run.Status.QUEUED and second.notice.startswith("Waiting for memory on cpu@d")
    assert run_admission(second, big.node) is None  # another worker's memory is its own
    train_run.push_request(hostname=box.node)
    try:
        with pytest.raises(Retry):  # the task comes back later; nothing was started
            train_run.run(second.pk)
    finally:
        train_run.pop_request()
    second.refresh_from_db()
    assert second.status == Run.Status.QUEUED and second.worker == "" and second.started_at is None

    first.finish(Run.Status.SUCCEEDED)
    assert run_admission(second, box.node) is None
    second.refresh_from_db()
    assert second.notice == ""  # the page no longer says it waits


@pytest.mark.django_db(transaction=True)
def test_a_real_training_worker_registers_its_devices_consumes_its_own_queue_and_never_trains_a_run_too_big(
    user, monkeypatch
):
    monkeypatch.setenv(DEVICES_ENV, "cpu:4GB")  # a small machine, as its administrator describes it
    prefix = f"test-{uuid.uuid4().hex[:8]}-"
    command = [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", f"{prefix}training",
               "--hostname", f"{prefix}training@%h", "--pool", "solo", "--without-gossip", "--without-mingle",
               "--loglevel", "INFO"]  # fmt: skip
    with workers_running([command]) as (node,):
        me = wait_for(lambda: next(iter(live_workers()), None), 60, "the worker to register its devices")
        assert (me.node, me.devices, me.source) == (node, Devices("cpu", 4 * 10**9), DEVICES_ENV)
        assert me.shared_queue == f"{prefix}training"
        queues = app.control.inspect(destination=[node], timeout=5).active_queues()[node]
        assert {q["name"] for q in queues} == {f"{prefix}training", f"{node}.training"}
        run = _queued_run(user)  # the cpu preset needs more than 4 GB
        app.send_task("webapp.tasks.train_run", args=[run.pk], queue=f"{prefix}training")
        wait_for(
            lambda: Run.objects.get(pk=run.pk).status == Run.Status.FAILED, 60, "the worker to refuse it"
        )
    run.refresh_from_db()
    assert run.started_at is None and run.worker == ""  # never claimed, never trained
    assert (
        "no worker can run it: it needs" in run.error
        and "GB per device; the worker has 1 × 4 GB RAM" in run.error
    )
    assert live_workers() == []  # it took its record out when it stopped


def test_up_refuses_a_malformed_worker_devices_description_before_starting_anything(monkeypatch):
    monkeypatch.setenv(DEVICES_ENV, "")  # restored afterwards: --worker-devices sets it for the workers
    with pytest.raises(CommandError, match="STUDIO_WORKER_DEVICES: devices must read like 8x80GB, cpu:24GB"):
        call_command("up", "--worker-devices", "lots of GPUs")


def test_the_plan_is_corrected_by_how_this_workers_newest_runs_stepped_against_their_plans(user):
    box = worker("cpu@f", "cpu:24GB", slots=2)
    register(box)
    cfg = get_preset("cpu").with_overrides(method="grpo")
    planned = planned_step_s = place(cfg).plan.step_s
    assert place(cfg).chosen.worker.node == box.node and plan_summary(place(cfg))["measured_pace"] is None
    for slower, steps in ((1.5, 5), (3.0, 6), (9.0, 4)):  # the last has too few steps to count
        run = _queued_run(user, method="grpo")
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, worker=f"{box.node}:7")
        for step in range(1, steps + 1):
            row = {"time/step_s": planned_step_s * slower * (1.2 if step == 1 else 1.0)}
            MetricRow.objects.create(run=run, step=step, wall_time=10.0 * step, values=row)
    pace = plan_summary(place(cfg))["measured_pace"]
    assert pace == {
        "low": pytest.approx(1.5),
        "median": pytest.approx(3.0),
        "high": pytest.approx(3.0),
        "runs": 2,
        "alike": True,
    }
    text = plan_display(place(cfg))["pace"]
    assert text.startswith("On cpu@f, whose last 2 runs of this env and method took 1.5–3.0× their planned ")
    assert f"{planned * 1.5 / 60:.0f} min–{planned * 3 / 60:.0f} min a step" in text


def test_the_plan_says_when_a_worker_has_less_memory_free_now_than_the_run_plans(user):
    cfg = get_preset("cpu").with_overrides(method="grpo")  # plans 9.5 GB
    register(replace(worker("cpu@g", "cpu:24GB"), free=4 * 10**9))
    assert plan_display(place(cfg))["free_warning"] == (
        "Only 4.0 GB of cpu@g's memory is free now (other work uses the rest); this run plans "
        f"{place(cfg).plan.device_bytes() / 1e9:,.1f} GB at its peak: it may run out of memory there until "
        "that work ends."
    )
    register(replace(worker("cpu@g", "cpu:24GB"), free=20 * 10**9))
    assert plan_display(place(cfg))["free_warning"] == ""
    register(worker("cpu@g", "cpu:24GB"))  # a worker that does not report it
    assert plan_display(place(cfg))["free_warning"] == "" and plan_summary(place(cfg))["free_now"] is None
