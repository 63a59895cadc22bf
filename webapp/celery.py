"""The Celery app. Broker: Redis; results: PostgreSQL (django-celery-results).

Two queues, each with workers of its own (``manage.py up`` starts one of each: ``worker_commands``):
``training`` for training runs (one run per worker slot, for hours) and ``default`` for light tasks (bank
imports, exports, previews), so that light work never waits behind runs. Start more workers with
``celery -A webapp worker -Q default`` (light work) or ``-Q training`` (a machine that trains).

A worker of a training queue also consumes a queue of its own (``<node>.training``) and registers its devices
(``webapp.workers``), so a launch that only some workers can run goes to one of those.
"""

import logging
import os
import threading
import time

from celery import Celery
from celery.signals import celeryd_after_setup, worker_process_init, worker_ready, worker_shutdown
from django.conf import settings

from experience.embedding import warm_up_in_background

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _trains_only() -> bool:
    """This worker consumes training queues only (``training``, or a test's ``<prefix>training``)."""
    queues = app.amqp.queues.consume_from or {}
    return bool(queues) and all(name.endswith("training") for name in queues)


@worker_process_init.connect
def _warm_start(**kwargs) -> None:
    """Each pool process loads the embedding model in the background as it starts (``STUDIO_WARM_START``),
    so its first bank task does not wait for it. In the pool process, not the parent: nothing that holds
    torch's threads is forked. Not in a worker that only trains: each run trains in a process of its own
    (``webapp.supervisor``) that loads what it needs, so an embedder here would only hold memory."""
    if settings.STUDIO_WARM_START and not _trains_only():
        warm_up_in_background()


def _training_queue(app_) -> str | None:
    """The shared training queue this worker consumes (``training``, or a test's ``<prefix>training``)."""
    queues = app_.amqp.queues.consume_from or {}
    return next((q for q in sorted(queues) if q.endswith("training") and "@" not in q), None)


@celeryd_after_setup.connect
def _consume_own_queue(sender: str, instance, **kwargs) -> None:
    """A training worker also consumes ``<node>.training``: a run only it can train is sent there."""
    from webapp.workers import configured_devices, own_queue  # loads torch: in a worker, not every process

    if _training_queue(instance.app) is not None:
        configured_devices()  # a malformed STUDIO_WORKER_DEVICES stops the worker here, with its message
        instance.app.amqp.queues.select_add(own_queue(sender))


@worker_ready.connect
def _register_devices(sender, **kwargs) -> None:
    """A training worker registers its devices, then refreshes its record every ``HEARTBEAT_S`` (a thread:
    finding CUDA devices asks torch in a child process, which takes seconds)."""
    shared = _training_queue(sender.app)
    if shared is None:
        return
    node, slots = sender.hostname, int(sender.controller.concurrency or 1)
    threading.Thread(
        target=_heartbeat, args=(node, shared, slots), name="device-registry", daemon=True
    ).start()


def _heartbeat(node: str, shared: str, slots: int) -> None:
    # loads torch (trainer.plan): in a training worker only, not in every process that imports webapp
    from dataclasses import replace

    import psutil

    from webapp.workers import HEARTBEAT_S, Worker, cpu_cores, detect_devices, register

    devices, source = detect_devices()
    worker = Worker(node, shared, devices, slots, cpu_cores(), source)
    logging.getLogger(__name__).info("registering %s (%s)", worker.describe(), source)
    while True:
        try:  # a CPU worker also says how much of its machine's memory is free now
            free = psutil.virtual_memory().available if devices.kind == "cpu" else None
            register(replace(worker, free=free))
        except Exception:  # noqa: BLE001 - Redis away for a moment: the next beat tries again
            logging.getLogger(__name__).warning("could not register this worker's devices", exc_info=True)
        time.sleep(HEARTBEAT_S)


@worker_shutdown.connect
def _unregister_devices(sender, **kwargs) -> None:
    """A worker that stops takes its record out at once (a killed one goes stale after ``STALE_S``)."""
    from webapp.workers import unregister  # loads torch: in a worker, not every process

    if sender is not None and _training_queue(app) is not None:
        try:
            unregister(sender.hostname)
        except Exception:  # noqa: BLE001 - stale after STALE_S anyway
            pass
