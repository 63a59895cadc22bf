from django.core.management.base import BaseCommand, CommandError

from trainer.config import ConfigError
from trainer.train import add_arguments, run_from_args


class Command(BaseCommand):
    help = (
        "Train the actor headless: manage.py train --config cpu --env MiniHack-Room-5x5 --method grpo "
        "--steps 20 [--set actor.lr=2e-5 ...] [--resume RUN_OR_CHECKPOINT] [--out DIR]. "
        "Prints a progress line per step."
    )

    def add_arguments(self, parser) -> None:
        add_arguments(parser)

    def handle(self, *args, **options) -> None:
        self.stdout.ending = ""
        try:
            run_from_args(_Namespace(options), stdout=self.stdout)
        except ConfigError as err:
            raise CommandError(str(err)) from err


class _Namespace:
    def __init__(self, options: dict) -> None:
        self.__dict__.update(options)
