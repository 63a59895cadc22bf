from __future__ import annotations

import socket
import uuid
from datetime import timedelta
from pathlib import Path

import psutil
from django.conf import settings
from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

HEARTBEAT_TIMEOUT_S = 120
"""A running run whose worker has not beaten for this long is shown as lost."""
HEARTBEAT_INTERVAL_S = 30
"""How often a training worker beats (``webapp.progress.Heartbeat``), whatever a step's length."""


def _holds_checkpoint(folder: Path) -> bool:
    return (folder / "state.json").exists() or any(folder.glob("checkpoints/step-*[0-9]/state.json"))


def _lives(pid: int, started: float) -> bool:
    """Process ``pid`` is the one that started at ``started`` (not a later one given its number) and is
    not a zombie."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def last_checkpoint_step(folder: str) -> int | None:
    """The step of the newest complete checkpoint in a run's folder (``checkpoints/step-N/state.json``),
    None when it holds none."""
    saved = Path(folder).glob("checkpoints/step-*[0-9]/state.json") if folder else ()
    return max((int(p.parent.name.removeprefix("step-")) for p in saved), default=None)


class RunQuerySet(models.QuerySet):
    def visible_to(self, user) -> RunQuerySet:
        """Runs a user may see: their own, shared ones, or all for staff."""
        if user.is_staff:
            return self
        return self.filter(Q(owner=user) | Q(shared=True))

    def active(self) -> RunQuerySet:
        return self.filter(status__in=[Run.Status.QUEUED, Run.Status.RUNNING])

    def lost(self) -> RunQuerySet:
        """Runs shown as lost (``Run.is_lost``), checked in Python on the few running runs: a stale
        heartbeat or a claiming process on this host that is gone, with no training process left here."""
        running = self.filter(status=Run.Status.RUNNING, heartbeat_at__isnull=False)
        fields = ("pk", "status", "worker", "processes", "heartbeat_at")
        lost = [run.pk for run in running.select_related(None).only(*fields) if run.is_lost]
        return running.filter(pk__in=lost)

    def with_display_status(self, status: str) -> RunQuerySet:
        """Runs showing ``status`` (``Run.display_status``): 'lost' ones apart from those still 'running'."""
        if status == "lost":
            return self.lost()
        if status == Run.Status.RUNNING:
            return self.filter(status=status).exclude(pk__in=self.lost().values("pk"))
        return self.filter(status=status)


class Experiment(models.Model):
    """A named grid of runs (methods × seeds on one shared budget) from ``configs/experiments/*.toml``;
    its runs keep their own pages and are its cells (``Run.experiment``, ``Run.cell``)."""

    name = models.SlugField(max_length=80, help_text="Unique among its owner's experiments.")
    folder = models.SlugField(
        max_length=120,
        unique=True,
        blank=True,
        help_text="Its folder under var/experiments/ and docs/experiments/: its name, or "
        "name--<owner id> when another owner's experiment had that name first.",
    )
    description = models.TextField(blank=True)
    spec = models.JSONField(default=dict, help_text="The experiment file as loaded (trainer.experiments).")
    source = models.CharField(max_length=500, blank=True, help_text="The file it was loaded from.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="experiments")
    shared = models.BooleanField(default=True, help_text="Visible to every user, not just the owner.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="one_experiment_name_per_owner")
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        self.folder = self.folder or self.name  # ``experiment_sync`` picks another when the name's is taken
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        """Its page: by name and owner (names are unique per owner only)."""
        return (
            reverse("experiment_detail", args=[self.name])
            + "?"
            + urlencode({"owner": self.owner.get_username()})
        )

    @property
    def arms(self) -> list[str]:
        """The grid's rows: its methods, then its variants, as the file names them."""
        return list(self.spec.get("methods", [])) + [v["name"] for v in self.spec.get("variants", [])]

    @property
    def cell_count(self) -> int:
        """Cells of the whole grid (arms × seeds), started or not."""
        return len(self.arms) * len(self.spec.get("seeds", []))


class Run(models.Model):
    """One training run: its configuration, its state, and who owns it."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    name = models.CharField(max_length=200)
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False, help_text="Names its folder.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs")
    shared = models.BooleanField(default=False, help_text="Visible to every user, not just the owner.")
    tags = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    method = models.CharField(max_length=32, default="grpo")
    env = models.CharField(max_length=100, default="MiniHack-Room-5x5")
    config = models.JSONField(default=dict)
    seed = models.IntegerField(default=0)
    step = models.IntegerField(default=0)
    actor_version = models.IntegerField(default=0)
    extractor_version = models.IntegerField(default=0)
    checkpoint_dir = models.CharField(max_length=500, blank=True)
    resume_from = models.CharField(max_length=500, blank=True)
    environment = models.JSONField(default=dict, blank=True, help_text="Code and package versions, host.")
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    celery_task_id = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=200, blank=True, help_text="Who trains it: <worker>@<host>:<pid>.")
    # db defaults: processes of an older code version still insert runs while a newer one has migrated
    restarts = models.IntegerField(default=0, db_default=0, help_text="Times its training was resumed.")
    notice = models.TextField(blank=True, default="", db_default="", help_text="What the system last did.")
    peak_rss_mb = models.IntegerField(null=True, blank=True, help_text="Peak memory of its training process.")
    progress = models.JSONField(
        default=dict, blank=True, db_default={},
        help_text="Where the step is inside a long phase (trainer.report.Progress): phase, done of total, "
        "elapsed and estimated seconds left.",
    )  # fmt: skip
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    processes = models.JSONField(
        default=dict, blank=True, db_default={},
        help_text="Its training processes, recorded by their supervisor: host and [pid, start time] of "
        "each (the child, or torchrun and every rank). A claim waits while one of them lives.",
    )  # fmt: skip
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    experiment = models.ForeignKey(
        Experiment, on_delete=models.SET_NULL, null=True, blank=True, related_name="runs"
    )
    cell = models.CharField(max_length=120, blank=True, help_text="Its cell in the experiment: arm/s<seed>.")
    launch_token = models.CharField(
        max_length=64, blank=True, db_index=True, help_text="The launch form submission that created it."
    )

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        permissions = [("launch_run", "Can launch, clone and resume runs")]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "cell"],
                condition=Q(experiment__isnull=False),
                name="one_run_per_experiment_cell",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def is_lost(self) -> bool:
        """Running, but no process is training it: its worker stopped beating (it died or lost the
        database), or the process that claimed it is gone; and none of its training processes lives on
        this host (an orphaned rank still holds it, ``group_is_alive``)."""
        if self.status != self.Status.RUNNING or self.heartbeat_at is None:
            return False
        stale = (timezone.now() - self.heartbeat_at).total_seconds() > HEARTBEAT_TIMEOUT_S
        return (stale or self.holder_is_gone) and not self.group_is_alive

    @property
    def display_status(self) -> str:
        return "lost" if self.is_lost else self.status

    @property
    def finished_all_steps(self) -> bool:
        """It succeeded and trained every step its config asks for: nothing is left to resume."""
        return self.status == self.Status.SUCCEEDED and self.step >= int(self.config.get("steps", 0))

    @property
    def checkpoint_source(self) -> str:
        """What "Resume from checkpoint" continues from: its own folder once it holds a complete checkpoint,
        else the checkpoint it started from; "" when there is none."""
        for folder in (self.checkpoint_dir, self.resume_from):
            if folder and _holds_checkpoint(Path(folder)):
                return folder
        return ""

    @property
    def error_summary(self) -> str:
        """The first line of ``error``: what went wrong and what to do (the traceback follows it)."""
        return self.error.split("\n", 1)[0]

    @property
    def error_details(self) -> str:
        return self.error.split("\n", 1)[1].strip() if "\n" in self.error else ""

    @property
    def holder_is_gone(self) -> bool:
        """Running, and the process that claimed it (``worker`` ends in ``@<host>:<pid>``) is on this host
        and no longer alive, nor any of its training processes: no need to wait for its heartbeat to go
        stale."""
        host, _, pid = self.worker.rpartition("@")[2].rpartition(":")
        return (
            self.status == self.Status.RUNNING
            and host == socket.gethostname()
            and pid.isdigit()
            and not psutil.pid_exists(int(pid))
            and not self.group_is_alive
        )

    @property
    def group_is_alive(self) -> bool:
        """One of its recorded training processes (``processes``: a rank, torchrun or the single child)
        still lives on this host, stopped (SIGSTOP) or hung included: its group may still write to the run,
        so no other group may start (docs/design.md §7). A process of another host cannot be asked: there
        only its heartbeat tells, which the supervisor beats while it watches the group."""
        if self.processes.get("host") != socket.gethostname():
            return False
        return any(_lives(pid, started) for pid, started in self.processes.get("pids", []))

    def claim(self, worker: str) -> bool:
        """Take this run for ``worker`` with one conditional UPDATE: a queued run, or a lost one (its worker
        died: heartbeat stale, or the claiming process gone; the task was redelivered or requeued). False if
        another worker has it, it ended or was cancelled, or a process of its last group still lives on
        this host (``group_is_alive``)."""
        now = timezone.now()
        stale = now - timedelta(seconds=HEARTBEAT_TIMEOUT_S)
        claimable = Q(status=self.Status.QUEUED) | Q(status=self.Status.RUNNING, heartbeat_at__lt=stale)
        if self.group_is_alive:
            return False  # its group still has a live rank, whatever its heartbeat says
        if self.holder_is_gone:
            claimable |= Q(status=self.Status.RUNNING, worker=self.worker)
        checked = {"processes": self.processes}  # the group checked above is still the one recorded
        claimed = Run.objects.filter(claimable, pk=self.pk, cancel_requested=False, **checked).update(
            status=self.Status.RUNNING,
            worker=worker,
            started_at=Coalesce(F("started_at"), Value(now)),
            heartbeat_at=now,
        )
        if claimed:
            self.refresh_from_db()
        return bool(claimed)

    def finish(self, status: str, error: str = "") -> None:
        Run.objects.filter(pk=self.pk).update(status=status, error=error, finished_at=timezone.now())
        self.refresh_from_db()

    def mark_failed(self, message: str) -> None:
        self.finish(self.Status.FAILED, message)


class MetricRow(models.Model):
    """One step's metrics (train or eval): the run's durable record and the replay cursor for live views."""

    class Kind(models.TextChoices):
        TRAIN = "train"
        EVAL = "eval"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    step = models.IntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.TRAIN)
    wall_time = models.FloatField(help_text="Seconds since the run started.")
    values = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]
        indexes = [models.Index(fields=["run", "kind", "step"])]
        constraints = [
            models.UniqueConstraint(fields=["run", "kind", "step"], name="one_metric_row_per_step")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.kind} step {self.step}"


class EpisodeRecord(models.Model):
    """One rollout of a step, with its turns, for the trajectory inspector and credit assignment: a training
    step's, or a greedy episode of the evaluation after ``step`` (``kind``), whose ``guided`` then says its
    column (with experience)."""

    class Kind(models.TextChoices):
        TRAIN = "train", "training"
        EVAL = "eval", "evaluation"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="episodes")
    step = models.IntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.TRAIN)
    task_instance = models.IntegerField(help_text="Rollouts of the same task instance share this id.")
    env = models.CharField(max_length=100)
    seed = models.IntegerField()
    guided = models.BooleanField()
    experience_id = models.BigIntegerField(null=True, blank=True)
    injected_experience = models.TextField(blank=True)
    reward = models.FloatField()
    success = models.BooleanField()
    num_actions = models.IntegerField()
    turns = models.JSONField(default=list)
    actor_version = models.IntegerField(default=0)
    extractor_version = models.IntegerField(default=0)

    class Meta:
        ordering = ["run", "step", "task_instance", "id"]
        indexes = [models.Index(fields=["run", "kind", "step"])]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} instance {self.task_instance}"
