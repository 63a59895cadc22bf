from django.core.management.base import BaseCommand, CommandError

from webapp import embedded


class Command(BaseCommand):
    help = "Start, stop or show the embedded PostgreSQL + pgvector and Redis servers (data under var/)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args, action: str, **options) -> None:
        if action == "start":
            try:
                started = embedded.start_all()
            except Exception as exc:  # noqa: BLE001 - show the reason, whatever the server said
                raise CommandError(f"could not start the embedded services: {exc}") from exc
            self.stdout.write(f"started: {', '.join(started) or 'nothing (already running)'}")
        elif action == "stop":
            stopped = embedded.stop_all()
            self.stdout.write(f"stopped: {', '.join(stopped) or 'nothing (not running)'}")
        for status in embedded.status_all():
            self.stdout.write(status.line())
