from django.core.management.base import BaseCommand

from trainer.envs.cli import play


class Command(BaseCommand):
    help = (
        "Play one episode of an environment in the terminal ('expert' plays the expert's move, 'quit' ends)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("env", help="environment name, e.g. MiniHack-Room-5x5 or Sokoban-6x6")
        parser.add_argument("--split", default="train", choices=["train", "eval"])
        parser.add_argument("--seed", type=int, default=0, help="instance of the split")

    def handle(self, *args, **options) -> None:
        self.stdout.ending = ""  # the cli functions print whole lines themselves
        play(options["env"], options["split"], options["seed"], stdout=self.stdout)
