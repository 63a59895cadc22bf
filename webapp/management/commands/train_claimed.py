from __future__ import annotations

from django.core.management.base import CommandError

from webapp.management.database import DatabaseCommand
from webapp.models import Run
from webapp.training import train_claimed


class Command(DatabaseCommand):
    help = (
        "Internal: train a run its supervisor has claimed (the training process of a worker or of "
        "'experiment run --here'; see webapp/supervisor.py). To train by hand, use 'manage.py train'."
    )
    # an internal child process: the checks belong where the product starts (`up`, `check`); here they
    # would only import every view and form (~1 s a run)
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", type=int)

    def handle(self, *args, run_id: int, **options) -> None:
        run = Run.objects.filter(pk=run_id).first()
        if run is None or run.status != Run.Status.RUNNING:
            raise CommandError(f"run {run_id} is not claimed for training ({run and run.status})")
        self.stdout.write(f"run {run_id}: {train_claimed(run)}")
