from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from webapp import embedded


class Command(BaseCommand):
    help = (
        "Start the whole product: embedded services, migrations, the admin account, a Celery worker "
        "and the ASGI server (daphne). Ctrl-C stops everything this command started."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("STUDIO_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("STUDIO_PORT", 8000)))
        parser.add_argument("--no-worker", action="store_true", help="Do not start a Celery worker here.")

    def handle(self, *args, host: str, port: int, no_worker: bool, **options) -> None:
        started = embedded.start_all()
        if embedded.uses_embedded_postgres():
            # The socket directory is known only once the server runs; connections open lazily after this.
            settings.DATABASES["default"]["HOST"] = str(embedded.pg_socket_dir())
        self.stdout.write(f"services: {', '.join(started) or 'already running'}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("prepare_models")
        call_command("ensure_admin")
        children = self._start_children(host, port, no_worker)
        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"Complementary RL Studio: {url}  (Ctrl-C stops)"))
        try:
            self._wait(children)
        finally:
            self._stop(children)
            stopped = embedded.stop_all(only=started)
            self.stdout.write(f"stopped: {', '.join(['web', 'worker'][: len(children)] + stopped)}")

    def _start_children(self, host: str, port: int, no_worker: bool) -> list[subprocess.Popen]:
        python = sys.executable
        web = [python, "-m", "daphne", "-b", host, "-p", str(port), "webapp.asgi:application"]
        slots = os.environ.get("STUDIO_WORKER_CONCURRENCY", "2")
        worker = [python, "-m", "celery", "-A", "webapp", "worker", "-Q", "training,default",
                  "--concurrency", slots, "--loglevel", "INFO"]  # fmt: skip
        commands = [web] if no_worker else [web, worker]
        # Own process groups: Ctrl-C reaches us once, and we stop the children in order.
        return [subprocess.Popen(cmd, start_new_session=True) for cmd in commands]

    def _wait(self, children: list[subprocess.Popen]) -> None:
        try:
            while all(child.poll() is None for child in children):
                time.sleep(0.5)
            failed = next(child for child in children if child.poll() is not None)
            self.stderr.write(f"{failed.args[2]} exited with status {failed.returncode}; stopping the rest.")
        except KeyboardInterrupt:
            self.stdout.write("\nstopping...")

    def _stop(self, children: list[subprocess.Popen]) -> None:
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
