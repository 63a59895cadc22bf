from django.core.management.base import BaseCommand

from trainer.envs.cli import bench


class Command(BaseCommand):
    help = (
        "Benchmark environments (all registered, or those named): reset and step cost, expert success on "
        "the first 50 eval instances, random valid-action success; prints a markdown table."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("envs", nargs="*", help="environment names (default: every registered one)")
        parser.add_argument(
            "--episodes", type=int, default=50, help="episodes for timings and the random policy"
        )

    def handle(self, *args, **options) -> None:
        self.stdout.ending = ""  # the cli functions print whole lines themselves
        bench(options["envs"] or None, options["episodes"], stdout=self.stdout)
