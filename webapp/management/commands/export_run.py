from __future__ import annotations

import uuid
from pathlib import Path

from django.core.management.base import CommandError

from trainer.paths import var_dir
from trainer.trackers import (
    MetricRecord,
    TrackerUnavailable,
    export_csv,
    export_tensorboard,
    export_wandb_offline,
)
from webapp.management.database import DatabaseCommand
from webapp.models import MetricRow, Run

FORMATS = ("tensorboard", "wandb-offline", "csv")


class Command(DatabaseCommand):
    help = (
        "Export a finished run's metrics (its rows in the database) for the trackers people already use: "
        "TensorBoard event files (view with `tensorboard --logdir DIR`), a W&B offline run (needs the wandb "
        "package; upload with `wandb sync DIR/wandb/offline-run-*`), or a CSV file."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("run", help="the run's id (as in its page's URL) or its uid")
        parser.add_argument("--format", choices=FORMATS, default="tensorboard")
        parser.add_argument("--out", help="where to write (default: var/exports/run-<id>-<format>)")

    def handle(self, *args, run: str, format: str, **opts) -> None:
        found = _find_run(run)
        if found.status in (Run.Status.QUEUED, Run.Status.RUNNING) and not found.is_lost:
            raise CommandError(
                f"run {found.pk} ({found.name}) is {found.status}: export it once it has finished "
                "(a running run writes TensorBoard files itself with tracking.tensorboard = true)"
            )
        out = Path(opts["out"] or var_dir() / "exports" / f"run-{found.pk}-{format}")
        records = _records(found)
        if not records:
            raise CommandError(f"run {found.pk} ({found.name}) has no metrics to export")
        try:
            written = self._export(found, records, format, out)
        except TrackerUnavailable as err:
            raise CommandError(str(err)) from None
        steps = len({r.step for r in records})
        what = f"{len(records)} metric rows ({steps} steps) of run {found.pk}"
        self.stdout.write(f"exported {what} to {written}")
        if format == "tensorboard":
            self.stdout.write(f"view them with: tensorboard --logdir {written}")
        elif format == "wandb-offline":
            self.stdout.write(f"upload with: wandb sync {written}/offline-run-*")

    def _export(self, run: Run, records: list[MetricRecord], format: str, out: Path) -> Path:
        if format == "tensorboard":
            start = (run.started_at or run.created_at).timestamp()
            return export_tensorboard(records, out, start_time=start)
        if format == "wandb-offline":
            return export_wandb_offline(records, out, name=run.name, config=run.config)
        return export_csv(records, out if out.suffix == ".csv" else out / f"run-{run.pk}-metrics.csv")


def _find_run(ref: str) -> Run:
    try:
        query = {"pk": int(ref)} if ref.isascii() and ref.isdigit() else {"uid": uuid.UUID(ref)}
    except ValueError:
        query = None
    run = Run.objects.filter(**query).first() if query else None
    if run is None:
        raise CommandError(f"no run {ref!r}: give a run's id or uid")
    return run


def _records(run: Run) -> list[MetricRecord]:
    rows = (
        MetricRow.objects.filter(run=run)
        .order_by("step", "kind")
        .values_list("kind", "step", "wall_time", "values")
    )
    return [MetricRecord(*row) for row in rows]
