"""Run a repository's tests in a sandbox: a fresh copy, no network, timeouts, resource limits.

Every run copies the repository into a new temporary folder (so a test run can never change the
agent's workspace), starts pytest in a child process inside a new network namespace (``unshare
-n``: no interface but a down loopback), with ``resource`` limits set in the child, a per-test
timeout (pytest-timeout) and an outer wall-clock timeout that kills the child's whole process
group. The copy is deleted in ``finally``. Results come back per test id through a tiny pytest
plugin (``plugin/swe_mini_report.py``).
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_DIR = Path(__file__).parent / "plugin"

PER_TEST_TIMEOUT_S = 5
"""pytest-timeout per test: a mutant that loops forever fails that test instead of hanging."""
OUTER_TIMEOUT_S = 90
"""Wall-clock limit of one whole pytest run; the child's process group is killed after it."""
MEMORY_LIMIT_BYTES = 2 * 1024**3
"""RLIMIT_AS of the child (address space)."""
CPU_LIMIT_S = 120
"""RLIMIT_CPU of the child (CPU seconds)."""
FILE_SIZE_LIMIT_BYTES = 64 * 1024**2
"""RLIMIT_FSIZE of the child: no test may write a file larger than this."""
NO_NETNS_ENV = "SWE_MINI_NO_NETNS"
"""Set to 1 to run tests without network isolation where ``unshare -n`` is not permitted."""


class SandboxUnavailable(RuntimeError):
    pass


@dataclass
class TestResult:
    nodeid: str
    outcome: str
    """passed, failed, skipped or error (a collection error)."""
    message: str = ""
    path: str = ""
    lineno: int = 0
    test_lineno: int = 0
    """The failing line in the test function itself (1-based; 0 when unknown)."""


@dataclass
class TestRun:
    results: dict[str, TestResult] = field(default_factory=dict)
    returncode: int = 0
    timed_out: bool = False
    seconds: float = 0.0
    output: str = ""

    def passed(self, nodeid: str) -> bool:
        r = self.results.get(nodeid)
        return r is not None and r.outcome == "passed"

    @property
    def failed(self) -> list[TestResult]:
        return [r for r in self.results.values() if r.outcome in ("failed", "error")]

    @property
    def collection_errors(self) -> list[TestResult]:
        return [r for r in self.results.values() if r.outcome == "error"]


@functools.cache
def _netns_prefix() -> tuple[str, ...]:
    """The command prefix that isolates the child from the network (checked once)."""
    if os.environ.get(NO_NETNS_ENV) == "1":
        return ()
    unshare = shutil.which("unshare")
    if unshare is not None:
        probe = subprocess.run([unshare, "-n", "true"], capture_output=True, text=True)
        if probe.returncode == 0:
            return (unshare, "-n")
        why = probe.stderr.strip() or f"exit status {probe.returncode}"
    else:
        why = "the unshare tool (util-linux) is not installed"
    raise SandboxUnavailable(
        f"SWE-mini runs tests in a new network namespace with `unshare -n`, which failed here ({why}). "
        "Run as root (or with CAP_SYS_ADMIN / unprivileged user namespaces enabled), or set "
        f"{NO_NETNS_ENV}=1 to run the tests WITHOUT network isolation."
    )


def _limit_child() -> None:
    """Runs in the child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def copy_repo(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))


def run_tests(
    repo: Path,
    targets: Sequence[str],
    *,
    deselect: Sequence[str] = (),
    overrides: Mapping[str, str] | None = None,
    per_test_timeout: int = PER_TEST_TIMEOUT_S,
    outer_timeout: float = OUTER_TIMEOUT_S,
) -> TestRun:
    """Run pytest on ``targets`` (test files or node ids) in a fresh, isolated copy of ``repo``.

    ``overrides`` maps relative paths to file contents written into the copy before the run
    (used to put back pristine test files when scoring).
    """
    prefix = _netns_prefix()
    tmp = Path(tempfile.mkdtemp(prefix="swe-mini-run-"))
    try:
        work = tmp / "repo"
        copy_repo(repo, work)
        for rel, text in (overrides or {}).items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        report = tmp / "report.jsonl"
        cmd = [*prefix, *_pytest_args(work, targets, deselect, per_test_timeout)]
        start = time.perf_counter()
        returncode, timed_out, output = _run_isolated(cmd, work, _child_env(tmp, work, report), outer_timeout)
        run = TestRun(returncode=returncode, timed_out=timed_out, output=output[-4000:])
        run.seconds = time.perf_counter() - start
        if report.exists():
            run.results = _read_report(report, work)
        return run
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pytest_args(
    work: Path, targets: Sequence[str], deselect: Sequence[str], per_test_timeout: int
) -> list[str]:
    """pytest with no plugin but the timeout and the result reporter, rooted at the copy."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "pytest_timeout",
        "-p",
        "swe_mini_report",
        f"--timeout={per_test_timeout}",
        "--rootdir",
        str(work),
        *(f"--deselect={d}" for d in deselect),
        *targets,
    ]


def _child_env(tmp: Path, work: Path, report: Path) -> dict[str, str]:
    """A minimal environment: nothing of the caller's but PATH, home and temp inside the run's folder."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join([str(work), str(PLUGIN_DIR)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "SWE_MINI_REPORT": str(report),
    }


def _run_isolated(
    cmd: list[str], work: Path, env: dict[str, str], outer_timeout: float
) -> tuple[int, bool, str]:
    """(return code, timed out, output) of ``cmd`` run in its own session under the resource limits;
    its whole process group is killed at ``outer_timeout`` and whatever happens, none outlives it."""
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        preexec_fn=_limit_child,
        start_new_session=True,
    )
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=outer_timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, timed_out, output


def _read_report(report: Path, work: Path) -> dict[str, TestResult]:
    """One result per test id from the plugin's rows (paths relative to the copy)."""
    results: dict[str, TestResult] = {}
    for line in report.read_text().splitlines():
        row = json.loads(line)
        row["path"] = str(row.get("path", "")).removeprefix(str(work) + os.sep)
        prev = results.get(row["nodeid"])
        # A test failed if any of its phases (or subtests) failed.
        if prev is None or row["outcome"] in ("failed", "error") and prev.outcome not in ("failed", "error"):
            results[row["nodeid"]] = TestResult(**_fields(row))
    return results


def _fields(row: dict) -> dict:
    return {
        k: row.get(k, 0 if "lineno" in k else "")
        for k in ("nodeid", "outcome", "message", "path", "lineno", "test_lineno")
    }
