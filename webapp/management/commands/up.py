from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from webapp import dbpool, embedded, metrics, webserver

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, a service manager or `docker stop`, a closed terminal: each stops all this command started."""
GRACE_S = 20
"""How long the web server and the workers get to stop by themselves before they are killed."""
WORKER_QUEUES = {"training": "STUDIO_WORKER_CONCURRENCY", "default": "STUDIO_LIGHT_WORKER_CONCURRENCY"}
"""The queues ``up`` starts a worker for, each with the setting that says how many tasks it runs at once."""


class StopRequested(KeyboardInterrupt):
    """The first stop signal: unwinds whatever phase is running, like Ctrl-C always did."""


class Command(BaseCommand):
    help = (
        "Start the whole product: embedded services, migrations, the admin account, two Celery workers "
        "(training runs; light work) and the ASGI server (uvicorn, STUDIO_WEB_PROCESSES processes). Ctrl-C, "
        "SIGTERM or SIGHUP stops everything this command started; a second one kills what is still stopping."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("STUDIO_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("STUDIO_PORT", 8000)))
        parser.add_argument("--no-worker", action="store_true", help="Do not start Celery workers here.")
        parser.add_argument(
            "--worker-devices",
            help="The training worker's devices instead of detecting them, e.g. 2x80GB or cpu:24GB "
            "(STUDIO_WORKER_DEVICES, which the workers inherit).",
        )

    def handle(self, *args, host: str, port: int, no_worker: bool, **options) -> None:
        _check_worker_devices(options.get("worker_devices"))
        self.children: dict[str, subprocess.Popen] = {}
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
        trees = self.trees or [p for child in self.children.values() for p in _tree(child.pid)]
        _signal_tree(trees, signal.SIGKILL)

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
        commands = product_commands(host, port, workers=not no_worker)
        metrics_dir = metrics.fresh_multiprocess_dir(Path(settings.VAR_DIR) / "prometheus-web")
        # Own sessions: a terminal's Ctrl-C or hang-up reaches us once, and we stop the children in order.
        # A stop signal waits until each child is recorded, so none can be started and forgotten.
        self.starting_children = True
        for name, cmd in commands.items():
            env = os.environ | child_env(name, metrics_dir)
            self.children[name] = subprocess.Popen(cmd, env=env, start_new_session=True)
        self.starting_children = False
        if self.deferred is not None:
            self._on_signal(self.deferred, None)

    def _wait(self) -> None:
        while all(child.poll() is None for child in self.children.values()):
            time.sleep(0.5)
        name = next(name for name, child in self.children.items() if child.poll() is not None)
        self.stderr.write(f"{name} exited with status {self.children[name].returncode}; stopping the rest.")

    def _stop_children(self) -> list[str]:
        """SIGTERM to each child (each stops its own), then SIGKILL to whatever is left of their process
        trees after GRACE_S, or at once on a second signal."""
        self.trees = [proc for child in self.children.values() for proc in _tree(child.pid)]
        for child in self.children.values():
            if child.poll() is None:
                child.terminate()
        _, alive = psutil.wait_procs(self.trees, timeout=GRACE_S)
        _signal_tree(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        for child in self.children.values():
            child.wait()
        return list(self.children)


def _check_worker_devices(given: str | None) -> None:
    """``--worker-devices`` goes to the workers as ``STUDIO_WORKER_DEVICES``; a malformed description stops
    ``up`` before it starts anything, with the forms it takes."""
    # torch (trainer.plan) would add ~200 MiB to the process that supervises the others, for this one check
    from trainer.plan import PlanError
    from webapp.workers import DEVICES_ENV, configured_devices

    if given:
        os.environ[DEVICES_ENV] = given
    try:
        configured_devices()
    except PlanError as err:
        raise CommandError(str(err)) from None


def product_commands(host: str, port: int, *, workers: bool = True) -> dict[str, list[str]]:
    """The processes ``up`` starts, by name: the web server (``STUDIO_WEB_PROCESSES`` processes) and, unless
    ``workers`` is false, a Celery worker per queue."""
    web = webserver.command(host, port, processes=settings.STUDIO_WEB_PROCESSES, python=sys.executable)
    return {"web": web} | (worker_commands() if workers else {})


def child_env(name: str, metrics_dir: Path) -> dict[str, str]:
    """What the child ``name`` of ``up`` adds to its environment: its database role, so that its pool has its
    role's bound (``webapp.dbpool``), and for the web server the folder where its processes add up their
    Prometheus counters (``webapp.metrics``; empty at start)."""
    if name != "web":
        return dbpool.role_env("worker")  # its training children say their own role (``webapp.supervisor``)
    return dbpool.role_env("web") | {metrics.MULTIPROCESS_ENV: str(metrics_dir)}


def worker_commands(python: str = sys.executable, *, prefix: str = "") -> dict[str, list[str]]:
    """The Celery workers ``up`` starts, by name: one per queue, so that light work (bank imports, exports,
    previews) never waits behind training runs, which can hold every training slot for hours. The light
    worker runs ``STUDIO_LIGHT_WORK_NICE`` below the web server: an import's embedding takes every core it
    finds, and pages come first. ``prefix`` gives the queues and node names one of its own (tests, beside a
    product running on the same Redis)."""
    commands = {}
    for queue, setting in WORKER_QUEUES.items():
        slots = str(getattr(settings, setting))
        nice = settings.STUDIO_LIGHT_WORK_NICE if queue == "default" else 0
        commands[f"worker-{queue}"] = [*(["nice", "-n", str(nice)] if nice else []),
                                       python, "-m", "celery", "-A", "webapp", "worker", "-Q", prefix + queue,
                                       "--hostname", f"{prefix}{queue}@%h", "--concurrency", slots,
                                       "--loglevel", "INFO"]  # fmt: skip
    return commands


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
