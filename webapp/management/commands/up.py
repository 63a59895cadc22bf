from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from webapp import embedded, webserver

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, a service manager or `docker stop`, a closed terminal: each stops all this command started."""
GRACE_S = 20
"""How long the web server and the worker get to stop by themselves before they are killed."""


class StopRequested(KeyboardInterrupt):
    """The first stop signal: unwinds whatever phase is running, like Ctrl-C always did."""


class Command(BaseCommand):
    help = (
        "Start the whole product: embedded services, migrations, the admin account, a Celery worker "
        "and the ASGI server (uvicorn). Ctrl-C, SIGTERM or SIGHUP stops everything this command started; "
        "a second one kills what is still stopping."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("STUDIO_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("STUDIO_PORT", 8000)))
        parser.add_argument("--no-worker", action="store_true", help="Do not start a Celery worker here.")

    def handle(self, *args, host: str, port: int, no_worker: bool, **options) -> None:
        self.children: list[subprocess.Popen] = []
        self.trees: list[psutil.Process] = []
        self.stopping = False
        self.deferred: int | None = None  # a stop signal that came while a child was being started
        self.starting_children = False
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        # Ours are the embedded services not running yet: only those are stopped at the end, even when a
        # signal lands half-way through starting them.
        ours = [s.name for s in embedded.status_all() if s.embedded and not s.running]
        try:
            self._start(host, port, no_worker)
            self._wait()
        except StopRequested:
            self._say("\nstopping...")
        finally:
            self.stopping = True
            stopped = self._stop_children()
            stopped += embedded.stop_all(only=ours)
            self._say(f"stopped: {', '.join(stopped) or 'nothing'}")

    def _say(self, line: str) -> None:
        """Print, unless the terminal is gone (a hang-up): stopping must go on regardless."""
        try:
            self.stdout.write(line)
        except OSError:
            pass

    def _on_signal(self, signum: int, frame) -> None:
        if self.starting_children:
            self.deferred = signum
            return
        if not self.stopping:
            self.stopping = True
            raise StopRequested(signal.Signals(signum).name)
        self._say(f"{signal.Signals(signum).name} again: killing what is still running.")
        _signal_tree(self.trees or [p for child in self.children for p in _tree(child.pid)], signal.SIGKILL)

    def _start(self, host: str, port: int, no_worker: bool) -> None:
        started = embedded.start_all()
        if embedded.uses_embedded_postgres():
            # The socket directory is known only once the server runs; connections open lazily after this.
            settings.DATABASES["default"]["HOST"] = str(embedded.pg_socket_dir())
        self.stdout.write(f"services: {', '.join(started) or 'already running'}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        call_command("prepare_models")
        call_command("ensure_admin")
        self._start_children(host, port, no_worker)
        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"Complementary RL Studio: {url}  (Ctrl-C stops)"))

    def _start_children(self, host: str, port: int, no_worker: bool) -> None:
        python = sys.executable
        web = webserver.command(host, port, python=python)
        slots = os.environ.get("STUDIO_WORKER_CONCURRENCY", "2")
        worker = [python, "-m", "celery", "-A", "webapp", "worker", "-Q", "training,default",
                  "--concurrency", slots, "--loglevel", "INFO"]  # fmt: skip
        # Own sessions: a terminal's Ctrl-C or hang-up reaches us once, and we stop the children in order.
        # A stop signal waits until each child is recorded, so none can be started and forgotten.
        self.starting_children = True
        for cmd in [web] if no_worker else [web, worker]:
            self.children.append(subprocess.Popen(cmd, start_new_session=True))
        self.starting_children = False
        if self.deferred is not None:
            self._on_signal(self.deferred, None)

    def _wait(self) -> None:
        while all(child.poll() is None for child in self.children):
            time.sleep(0.5)
        failed = next(child for child in self.children if child.poll() is not None)
        self.stderr.write(f"{failed.args[2]} exited with status {failed.returncode}; stopping the rest.")

    def _stop_children(self) -> list[str]:
        """SIGTERM to each child (each stops its own), then SIGKILL to whatever is left of their process
        trees after GRACE_S, or at once on a second signal."""
        self.trees = [proc for child in self.children for proc in _tree(child.pid)]
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        _, alive = psutil.wait_procs(self.trees, timeout=GRACE_S)
        _signal_tree(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        for child in self.children:
            child.wait()
        return ["web", "worker"][: len(self.children)]


def _tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (a worker's pool children, and theirs)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_tree(procs: list[psutil.Process], signum: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
