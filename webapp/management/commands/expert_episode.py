from django.core.management.base import BaseCommand

from trainer.envs.cli import expert_episode


class Command(BaseCommand):
    help = "Print one episode of an environment's expert, turn by turn."

    def add_arguments(self, parser) -> None:
        parser.add_argument("env", help="environment name, e.g. MiniHack-KeyRoom-Dark-S5")
        parser.add_argument("--split", default="eval", choices=["train", "eval"])
        parser.add_argument("--seed", type=int, default=0, help="instance of the split")

    def handle(self, *args, **options) -> None:
        self.stdout.ending = ""  # the cli functions print whole lines themselves
        expert_episode(options["env"], options["split"], options["seed"], stdout=self.stdout)
