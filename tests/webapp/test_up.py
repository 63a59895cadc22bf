"""`manage.py up` as a service manager runs it: started in a fresh data folder, stopped by a signal, leaving
no process behind (its web server, its two workers, their children, and the embedded servers it started);
what it starts: the web server's processes, each child's database role, the light worker's CPU priority."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path
from urllib.parse import urlencode

import psutil

from tests.conftest import wait_for
from tests.webapp.conftest import REPO, free_port, manage
from webapp.management.commands.up import child_env, product_commands, worker_commands


def _get(opener, url: str) -> tuple[int, str]:
    with opener.open(url, timeout=5) as response:
        return response.status, response.read().decode()


def _celery_ping(env: dict) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "webapp", "inspect", "ping", "-t", "3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout + done.stderr


def _both_workers_answer(env: dict) -> bool:
    """The worker of the training queue and the worker of light work (queue ``default``) answer a ping."""
    replies = _celery_ping(env)
    return "training@" in replies and "default@" in replies


def _start_up(env: dict, log: Path) -> subprocess.Popen:
    with log.open("w") as out:  # a file, not a pipe: a full pipe would stall the children that share it
        command = [sys.executable, "manage.py", "up"]
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=out)


def _service_processes(env: dict) -> list[psutil.Process]:
    """The embedded servers of this data folder (daemons: not descendants of `up`) and their children."""
    var = Path(env["STUDIO_VAR"])
    pid_files = [var / "redis" / "redis.pid", var / "pg" / "postmaster.pid"]
    procs = [psutil.Process(int(path.read_text().split()[0])) for path in pid_files]
    return procs + [child for proc in procs for child in proc.children(recursive=True)]


def _stopped_by(up: subprocess.Popen, signum: int, processes: list[psutil.Process], log: Path) -> str:
    up.send_signal(signum)
    up.wait(timeout=120)
    _, alive = psutil.wait_procs(processes, timeout=10)
    output = log.read_text()
    assert up.returncode == 0, output
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}\n{output}"
    return output


def test_sigterm_stops_the_web_server_both_workers_and_the_services_it_started(fresh_var):
    port = free_port()
    env = fresh_var | {"STUDIO_ADMIN_PASSWORD": "a long test password", "STUDIO_PORT": str(port)}
    log = Path(env["STUDIO_VAR"]).parent / "up.log"
    up = _start_up(env, log)
    try:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        base = f"http://127.0.0.1:{port}"

        def login_page() -> tuple[int, str] | None:
            assert up.poll() is None, log.read_text()
            try:
                return _get(opener, base + "/login/")
            except OSError:
                return None

        status, page = wait_for(login_page, 180, "the web server")
        assert status == 200 and "Log in" in page
        # The admin account works: log in with the CSRF token from the form, reach the dashboard.
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        credentials = {"username": "admin", "password": env["STUDIO_ADMIN_PASSWORD"]}
        form = urlencode(credentials | {"csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(base + "/login/", data=form, headers={"Referer": base + "/login/"})
        with opener.open(request, timeout=10) as response:
            assert response.status == 200 and "Runs" in response.read().decode()
        wait_for(lambda: _both_workers_answer(env), 120, "the training and the light worker", interval=1)
        processes = psutil.Process(up.pid).children(recursive=True) + _service_processes(env)
        names = " ".join(" ".join(p.cmdline()) for p in processes)
        assert "uvicorn" in names and "redis-server" in names and "postgres" in names
        assert "-Q training --hostname training@%h" in names and "-Q default --hostname default@%h" in names
        _check_web_processes_roles_and_priorities(psutil.Process(up.pid))
    except BaseException:
        up.kill()
        raise
    output = _stopped_by(up, signal.SIGTERM, processes, log)
    assert "stopped: web, worker-training, worker-default, postgres, redis" in output
    status = manage(fresh_var, "services", "status")
    assert re.search(r"postgres\s+stopped", status) and re.search(r"redis\s+stopped", status)


def test_a_hang_up_while_starting_stops_the_services_it_had_started(fresh_var):
    log = Path(fresh_var["STUDIO_VAR"]).parent / "up.log"
    up = _start_up(fresh_var | {"STUDIO_PORT": str(free_port())}, log)
    try:
        started = "services: postgres, redis"
        wait_for(lambda: up.poll() is None and started in log.read_text(), 120, "the services")
        processes = psutil.Process(up.pid).children(recursive=True) + _service_processes(fresh_var)
    except BaseException:
        up.kill()
        raise
    output = _stopped_by(up, signal.SIGHUP, processes, log)
    assert "stopped: postgres, redis" in output


def _check_web_processes_roles_and_priorities(up: psutil.Process) -> None:
    """Two web-server processes (``STUDIO_WEB_PROCESSES``) under uvicorn's supervisor, with the web role and
    their metrics folder in their environment; the light worker below the web server's CPU priority."""
    children = {" ".join(child.cmdline()): child for child in up.children()}
    web = next(child for line, child in children.items() if "uvicorn" in line)
    servers = [p for p in web.children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(servers) == 2, [p.cmdline() for p in web.children()]
    light = next(child for line, child in children.items() if "-Q default" in line)
    training = next(child for line, child in children.items() if "-Q training" in line)
    environ = servers[0].environ()  # (Celery's processes rewrite theirs with their titles: child_env's test)
    assert environ["STUDIO_DB_ROLE"] == "web" and Path(environ["PROMETHEUS_MULTIPROC_DIR"]).is_dir()
    assert light.nice() == web.nice() + 5 and training.nice() == web.nice()


def test_the_web_server_is_as_many_processes_as_configured_on_one_port(settings):
    settings.STUDIO_WEB_PROCESSES = 3
    web = product_commands("127.0.0.1", 8123)["web"]
    assert web[web.index("--workers") + 1] == "3" and web[web.index("--port") + 1] == "8123"
    assert list(product_commands("127.0.0.1", 8123, workers=False)) == ["web"]


def test_each_child_says_its_database_role_and_the_web_server_where_its_metrics_add_up(tmp_path):
    assert child_env("web", tmp_path) == {
        "STUDIO_DB_ROLE": "web", "STUDIO_DB_POOL_SIZE": "10", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }  # fmt: skip
    for worker in ("worker-training", "worker-default"):
        assert child_env(worker, tmp_path) == {"STUDIO_DB_ROLE": "worker", "STUDIO_DB_POOL_SIZE": "4"}


def test_the_light_worker_runs_below_the_web_servers_cpu_priority(settings):
    """Its command, started with a program that prints its niceness in place of Celery."""
    import os

    settings.STUDIO_LIGHT_WORK_NICE = 6
    for name, command in worker_commands().items():
        python = command.index(sys.executable)
        printed = subprocess.run(
            [*command[:python], sys.executable, "-c", "import os; print(os.nice(0))"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        expected = min(os.nice(0) + 6, 19) if name == "worker-default" else os.nice(0)
        assert int(printed.stdout) == expected, name
    settings.STUDIO_LIGHT_WORK_NICE = 0
    assert worker_commands()["worker-default"][0] == sys.executable
