from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from trainer.config import ConfigError
from trainer.fit import add_arguments, plan_from_args


class Command(BaseCommand):
    help = (
        "Plan a launch before it runs: bytes per device (weights, gradients, AdamW, activations, engines, "
        "episodes) and the time per step. manage.py plan --config cpu|FILE [--set key=value ...] "
        "[--devices 8x80GB] [--nproc N]. Exits non-zero with the reason and a fix when it does not fit."
    )

    def add_arguments(self, parser) -> None:
        add_arguments(parser)

    def handle(self, *args, **options) -> None:
        namespace = _Namespace(options)
        try:
            refused = plan_from_args(namespace, self.stdout)
        except ConfigError as err:
            raise CommandError(str(err)) from err
        if refused:
            raise CommandError(f"refused: {refused}")
        self.stdout.write("fits")


class _Namespace:
    def __init__(self, options: dict) -> None:
        self.__dict__.update(options)
