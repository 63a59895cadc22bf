"""Which worker a run trains on: each training worker's devices, and the launch's placement among them.

Every Celery worker that consumes training work registers its devices when it starts (``webapp.celery``):
the ones ``STUDIO_WORKER_DEVICES`` describes (``2x80GB``, ``cpu:24GB``), else the CUDA devices torch finds,
else this machine's memory as one CPU device. The registry is a Redis hash, one JSON record per worker node
with a last-seen time that the worker refreshes every ``HEARTBEAT_S``; a record older than ``STALE_S`` is a
worker that is gone. Each training worker also consumes a queue of its own (``own_queue``).

A launch is placed (``place``) by the plan of its config (``trainer.plan``) on each live worker's devices:
when every worker of the shared training queue can run it, it goes to that queue (any free worker takes it);
when only some can, to the own queue of one of them; when none can, it is refused with the plan's numbers
and a fix. With no worker registered (a fresh install, workers still starting) the web server's machine
stands in for the workers (or ``STUDIO_WORKER_DEVICES``), so a launch is judged the same way.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Any

import redis
from django.conf import settings

from trainer.config import ConfigError, RunConfig
from trainer.fit import refusal
from trainer.plan import Devices, Plan, PlanError, plan_run
from webapp.models import Run

log = logging.getLogger(__name__)

DEVICES_ENV = "STUDIO_WORKER_DEVICES"
"""This worker's devices, described instead of detected: ``2x80GB`` (GPUs), ``cpu:24GB``, ``cpu``."""
REGISTRY_ENV = "STUDIO_WORKER_REGISTRY"
"""The Redis key of the registry (a test's registry of its own; the product's by default)."""
DEFAULT_REGISTRY = "studio:worker-devices"
HEARTBEAT_S = 20.0
"""How often a worker refreshes its record."""
STALE_S = 60.0
"""A record not refreshed for this long belongs to a worker that is gone: no launch is placed on it."""
TRAINING_QUEUE = "training"
"""The product's shared queue of training runs, unless ``CELERY_TASK_ROUTES`` names another."""
OWN_QUEUE_SUFFIX = ".training"

CUDA_PROBE = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([torch.cuda.get_device_properties(i).total_memory for i in range(n)]))\n"
)
"""Run in a child process: CUDA initialised in a worker's parent would be broken in its forked pool."""


def training_queue() -> str:
    """The shared queue ``train_run`` is routed to by the settings (a browser test's queue of its own)."""
    route = getattr(settings, "CELERY_TASK_ROUTES", {}).get("webapp.tasks.train_run", {})
    return route.get("queue", TRAINING_QUEUE)


def own_queue(node: str) -> str:
    """The queue only the worker ``node`` consumes (``training@host`` -> ``training@host.training``)."""
    return node + OWN_QUEUE_SUFFIX


@dataclass(frozen=True)
class Worker:
    """A training worker as it registered: its node name, queues, devices, slots and CPU cores."""

    node: str
    shared_queue: str
    devices: Devices
    slots: int = 1
    cores: int = 1
    source: str = "detected"
    """How its devices were found: detected, or STUDIO_WORKER_DEVICES."""
    seen: float = 0.0
    """Unix time of its last heartbeat."""
    free: int | None = None
    """Bytes of memory free on a CPU worker's machine at its last heartbeat (None: not reported)."""

    @property
    def queue(self) -> str:
        return own_queue(self.node)

    def describe(self) -> str:
        return f"{self.node}: {self.devices.describe()}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Worker:
        data = json.loads(text)
        return cls(**(data | {"devices": Devices(**data["devices"])}))


# ---- this machine's devices ------------------------------------------------------------------------


def configured_devices() -> Devices | None:
    """The devices ``STUDIO_WORKER_DEVICES`` describes (None when unset); PlanError when malformed."""
    text = os.environ.get(DEVICES_ENV, "").strip()
    if not text:
        return None
    try:
        return Devices.parse(text)
    except PlanError as err:
        raise PlanError(f"{DEVICES_ENV}: {err}") from None


@cache
def _cuda_memories() -> list[int]:
    """Each CUDA device's memory, asked of torch in a child process (once: the devices stay); [] with no
    NVIDIA driver here."""
    if not (os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi")):
        return []
    try:
        done = subprocess.run(
            [sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True, timeout=120, check=True
        )
        return [int(m) for m in json.loads(done.stdout.strip().splitlines()[-1])]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        log.warning("could not ask torch for CUDA devices; planning for this machine's CPU", exc_info=True)
        return []


def detect_devices() -> tuple[Devices, str]:
    """This machine's devices and how they were found: ``STUDIO_WORKER_DEVICES``, else every CUDA device
    (the smallest one's memory, this machine's RAM as host memory), else the machine as one CPU device."""
    if (configured := configured_devices()) is not None:
        return configured, DEVICES_ENV
    machine = Devices.this_machine()
    memories = _cuda_memories()
    if memories:
        return Devices("cuda", min(memories), len(memories), host=machine.memory), "detected"
    return machine, "detected"


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def stand_in() -> Worker:
    """The web server's machine, standing in for the workers while none is registered."""
    devices, source = detect_devices()
    return Worker(
        "this machine (no worker registered yet)", training_queue(), devices, 1, cpu_cores(), source
    )


# ---- the registry ---------------------------------------------------------------------------------


def registry_key() -> str:
    return os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY


def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)


def register(worker: Worker) -> None:
    """Record (or refresh) ``worker`` as seen now."""
    with _redis() as client:
        client.hset(registry_key(), worker.node, replace(worker, seen=time.time()).to_json())


def unregister(node: str) -> None:
    with _redis() as client:
        client.hdel(registry_key(), node)


def live_workers() -> list[Worker]:
    """The registered workers seen within ``STALE_S``, by node name; older records are removed. [] when
    Redis cannot be reached (a launch is then judged on this machine; Celery could not queue it either)."""
    try:
        with _redis() as client:
            records = client.hgetall(registry_key())
            workers = [Worker.from_json(text) for text in records.values()]
            gone = [w.node for w in workers if w.seen < time.time() - STALE_S]
            if gone:
                client.hdel(registry_key(), *gone)
    except redis.RedisError:
        log.warning("the worker registry could not be read", exc_info=True)
        return []
    return sorted((w for w in workers if w.node not in gone), key=lambda w: w.node)


def registered(node: str) -> Worker | None:
    return next((w for w in live_workers() if w.node == node), None)


# ---- placement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One worker judged for one config: the plan on the devices the run would get there, and why it does
    not fit (None when it does)."""

    worker: Worker
    devices: Devices
    plan: Plan
    why_not: str | None

    @property
    def fits(self) -> bool:
        return self.why_not is None


def run_devices(cfg: RunConfig, worker: Worker) -> tuple[Devices, str | None]:
    """The devices a run of ``cfg`` gets on ``worker``, and why it cannot run there at all (else None).

    ``device=cpu`` on a GPU worker plans for its host memory; ``device=cuda`` needs CUDA devices. On a CPU
    worker ``nproc`` processes share the machine's memory (each gets 1/nproc of it), one per CPU core."""
    devices, nproc = worker.devices, cfg.nproc
    wants = "cuda" if cfg.device.startswith("cuda") else "cpu" if cfg.device == "cpu" else devices.kind
    if wants == "cuda" and devices.kind != "cuda":
        why = f"it asks for CUDA devices (device={cfg.device}); the worker has none; use device=auto or cpu"
        return devices, why
    if wants == "cpu" and devices.kind == "cuda":
        if devices.host is None:
            why = f"it asks for the CPU (device=cpu); the worker's host memory is unknown ({DEVICES_ENV})"
            return devices, why
        devices = Devices("cpu", devices.host)
    if devices.kind == "cpu" and nproc > 1:
        if nproc > worker.cores:
            cores = worker.cores
            why = f"it asks for {nproc} processes; the worker has {cores} CPU cores; set nproc ≤ {cores}"
            return devices, why
        devices = devices.shared_by(nproc)
    return devices, None


def check(cfg: RunConfig, worker: Worker) -> Check:
    """The plan of ``cfg`` on ``worker`` and whether it fits (memory per device, devices, time)."""
    devices, why = run_devices(cfg, worker)
    try:
        plan = plan_run(cfg, devices, nproc=cfg.nproc)
    except (KeyError, TypeError, ValueError) as err:  # a config.json that is not a Llama-style decoder's
        raise PlanError(f"a model's config.json does not describe a Llama-style decoder (no {err})") from None
    if why is None and not plan.fits(devices):
        why = refusal(cfg, devices, cfg.nproc)
    elif why is not None and cfg.nproc > 1 and (alone := _one_process_refusal(cfg, worker)):
        why = f"{why}; on one process {alone}"  # the plan's numbers too, not only the missing devices
    return Check(worker, devices, plan, why)


def _one_process_refusal(cfg: RunConfig, worker: Worker) -> str | None:
    """Why ``cfg`` would not fit ``worker`` on one process either (None when it would)."""
    alone = cfg.with_overrides(nproc=1)
    devices, why = run_devices(alone, worker)
    return why or refusal(alone, devices, 1)


@dataclass(frozen=True)
class Placement:
    """Where a launch goes: ``queue`` (None when refused), the plan on the chosen worker (on the largest
    when refused), every worker checked, and the refusal's text."""

    chosen: Check
    checks: tuple[Check, ...]
    queue: str | None
    stand_in: bool = False
    config: RunConfig | None = None

    @property
    def plan(self) -> Plan:
        return self.chosen.plan

    @property
    def refusal(self) -> str | None:
        if self.queue is not None:
            return None
        who = "this machine (no worker has registered)" if self.stand_in else _workers_named(self.checks)
        return f"no worker can run this launch ({who}): {self.chosen.why_not}"


def _workers_named(checks: tuple[Check, ...]) -> str:
    if len(checks) == 1:
        return f"the only worker, {checks[0].worker.describe()}"
    return f"{len(checks)} workers checked, the largest {max(checks, key=_size).worker.describe()}"


def _size(c: Check) -> tuple[int, int]:
    d = c.worker.devices
    return (d.count * d.memory, d.memory)


def _busy(node: str) -> int:
    """Runs training on ``node`` now (their ``worker`` is ``<node>:<pid>``)."""
    return Run.objects.filter(status=Run.Status.RUNNING, worker__startswith=f"{node}:").count()


def place(
    cfg: RunConfig, *, workers: list[Worker] | None = None, exclude: str = "", queue: str = ""
) -> Placement:
    """Where a launch of ``cfg`` goes among the live workers of the shared ``queue`` (``workers``: these
    instead; ``exclude``: leave out this node and never pick a shared queue, for a worker handing on a run
    it cannot train). Workers of other shared queues (a test's ``<prefix>training``) are not the product's."""
    if workers is None:
        workers = [w for w in live_workers() if w.shared_queue == (queue or training_queue())]
    workers = [w for w in workers if w.node != exclude]
    stand = not workers and not exclude
    checks = tuple(check(cfg, w) for w in (workers or ([stand_in()] if stand else [])))
    if not checks:
        raise PlanError("no other worker is registered")
    fitting = [c for c in checks if c.fits]
    if not fitting:
        return Placement(max(checks, key=_size), checks, None, stand, cfg)
    if stand:
        return Placement(fitting[0], checks, training_queue(), stand, cfg)
    # the smallest that fits among the least busy: big machines stay free for big runs
    chosen = min(fitting, key=lambda c: (_busy(c.worker.node) - c.worker.slots, _size(c)))
    shared = chosen.worker.shared_queue
    everyone_fits = all(c.fits for c in checks if c.worker.shared_queue == shared)
    return Placement(
        chosen, checks, shared if everyone_fits and not exclude else chosen.worker.queue, config=cfg
    )


def planned_bytes(cfg: RunConfig, worker: Worker) -> int:
    """What a run of ``cfg`` takes of ``worker``'s memory at its planned peak: every process's peak."""
    plan = check(cfg, worker).plan
    return plan.device_bytes() * plan.nproc


def wait_reason(cfg: RunConfig, worker: Worker, training: list[tuple[int, RunConfig]]) -> str | None:
    """Why ``worker`` should not start a run of ``cfg`` beside the runs it trains (``training``: their ids
    and configs): their planned peaks and this one's add up to more than its memory. None: start it. A run
    that fits the worker alone always starts on an idle one."""
    if not training:
        return None
    need, total = planned_bytes(cfg, worker), worker.devices.memory * worker.devices.count
    taken = [(pk, planned_bytes(other, worker)) for pk, other in training]
    if need + sum(b for _, b in taken) <= total:
        return None
    beside = ", ".join(f"run {pk} (planned {_gb(b)})" for pk, b in taken)
    return (
        f"Waiting for memory on {worker.node}: this run's planned peak of {_gb(need)} does not fit beside "
        f"{beside} in its {_gb(total)}; it starts when one of them ends."
    )


def place_all(configs: list[RunConfig]) -> Placement:
    """The placement of each config (an experiment's cells); the first refused one, else the first."""
    placements = [place(cfg) for cfg in configs]
    return next((p for p in placements if p.refusal), placements[0])


# ---- what the form and the API show ---------------------------------------------------------------


def plan_summary(placement: Placement) -> dict[str, Any]:
    """The plan as data: bytes per device per part, the peak, the time estimates, where it goes and why
    not (the API's answer and the launch form's table)."""
    plan, chosen = placement.plan, placement.chosen
    return {
        "fits": placement.queue is not None,
        "refusal": placement.refusal,
        "queue": placement.queue,
        "worker": chosen.worker.node,
        "devices": chosen.devices.describe(),
        "device_kind": plan.kind,
        "nproc": plan.nproc,
        "parts": [{"name": p.name, "bytes": p.bytes, "host": p.host} for p in plan.parts],
        "peak_bytes": plan.device_bytes(),
        "device_memory": chosen.devices.memory,
        "step_s": plan.step_s,
        "eval_s": plan.eval_s,
        "measured_pace": None if placement.stand_in else measured_pace(chosen.worker, placement.config),
        "free_now": chosen.worker.free,
        "table": plan.table(),
        "notes": list(plan.notes),
        "workers": [
            {"node": c.worker.node, "devices": c.worker.devices.describe(), "why_not": c.why_not}
            for c in placement.checks
        ],
    }


PACE_RUNS = 8
"""Runs of a worker whose steps correct its plans' time estimates: its newest ones with enough steps."""
PACE_STEPS = 5
"""Of each, the median of its newest steps (evaluations are not steps)."""


def measured_pace(worker: Worker, cfg: RunConfig | None = None) -> dict[str, Any] | None:
    """How long this worker's newest runs took a step against what their plans said, as ratios (measured /
    planned; above 1: slower than planned, e.g. beside other work): lowest, median, highest and the number
    of runs; those of ``cfg``'s env and method when the worker has some (episode lengths differ by task far
    more than the plan's worst case says: docs/launches.md). None before a run of it has ``PACE_STEPS``
    steps."""
    ratios: dict[bool, list[float]] = {True: [], False: []}
    runs = Run.objects.filter(worker__startswith=f"{worker.node}:").exclude(status=Run.Status.QUEUED)
    for run in runs.order_by("-started_at")[: PACE_RUNS * 3]:
        measured = _median_step_s(run)
        try:
            planned = check(RunConfig.from_dict(run.config), worker).plan.step_s
        except ConfigError:
            continue
        if measured and planned > 0:
            alike = cfg is not None and (run.env, run.method) == (cfg.env, cfg.method)
            ratios[alike].append(measured / planned)
    chosen = sorted((ratios[True] or ratios[False])[:PACE_RUNS])
    if not chosen:
        return None
    return {
        "low": chosen[0], "median": chosen[len(chosen) // 2], "high": chosen[-1], "runs": len(chosen),
        "alike": bool(ratios[True]),
    }  # fmt: skip


def _median_step_s(run: Run) -> float | None:
    rows = run.metrics.filter(kind="train").order_by("-step").values_list("values", flat=True)[:PACE_STEPS]
    times = sorted(v["time/step_s"] for v in rows if isinstance(v.get("time/step_s"), int | float))
    return times[len(times) // 2] if len(times) == PACE_STEPS else None


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def plan_display(placement: Placement) -> dict[str, Any]:
    """``plan_summary`` with its sizes and times written for people (the launch form's plan table)."""
    summary = plan_summary(placement)
    return summary | {
        "rows": [(p["name"], p["host"], _gb(p["bytes"])) for p in summary["parts"]],
        "peak": _gb(summary["peak_bytes"]),
        "memory": _gb(summary["device_memory"]),
        "step": _duration(summary["step_s"]),
        "eval": _duration(summary["eval_s"]),
        "pace": _pace_text(summary),
        "free_warning": _free_text(summary),
    }


def _free_text(summary: dict[str, Any]) -> str:
    """A warning when the worker's machine has less memory free now than the run's planned peak ("" else):
    it fits the machine, not what other work leaves of it at the moment."""
    free, need = summary["free_now"], summary["peak_bytes"] * summary["nproc"]
    if free is None or not summary["fits"] or need <= free:
        return ""
    return (
        f"Only {_gb(free)} of {summary['worker']}'s memory is free now (other work uses the rest); this run "
        f"plans {_gb(need)} at its peak: it may run out of memory there until that work ends."
    )


def _pace_text(summary: dict[str, Any]) -> str:
    """The plan's times corrected by this worker's measured pace, as a range ("" before it has one)."""
    pace = summary["measured_pace"]
    if not pace:
        return ""
    step = [_duration(summary["step_s"] * pace[k]) for k in ("low", "high")]
    evaluation = [_duration(summary["eval_s"] * pace[k]) for k in ("low", "high")]
    runs = f"{pace['runs']} run{'s' if pace['runs'] > 1 else ''}"
    runs += " of this env and method" if pace["alike"] else ""
    return (
        f"On {summary['worker']}, whose last {runs} took {pace['low']:.1f}–{pace['high']:.1f}× their planned "
        f"step time: {step[0]}–{step[1]} a step, {evaluation[0]}–{evaluation[1]} an evaluation."
    )
