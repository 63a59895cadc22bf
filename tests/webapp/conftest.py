"""A product started from scratch: a fresh data folder and free ports, for the command tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from trainer.models import default_model_path
from trainer.paths import var_dir

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fresh_var():
    """Environment for a product whose data lives in a new folder, on ports nobody else uses.

    Not pytest's tmp_path: its parents are private to root, and PostgreSQL runs as another user.
    """
    tmp_path = Path(tempfile.mkdtemp(prefix="fresh-", dir=var_dir()))
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "STUDIO_DB_NAME"}}
    env |= {
        "STUDIO_VAR": str(tmp_path / "var"),
        "STUDIO_REDIS_PORT": str(free_port()),
        "STUDIO_MODELS": str(default_model_path().parent),
        "PYTHONUNBUFFERED": "1",
    }
    yield env
    subprocess.run([sys.executable, "manage.py", "services", "stop"], cwd=REPO, env=env, capture_output=True)
    shutil.rmtree(tmp_path, ignore_errors=True)


def run_manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def manage(env: dict, *args: str) -> str:
    done = run_manage(env, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
