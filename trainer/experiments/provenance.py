"""What produced a committed figure: the command, the code, the machine and how busy it was.

Every measurement that lands in docs/ writes its output file with this block beside its figures, so a
figure can be traced to the commit and the conditions it came from (a timing measured on a loaded machine
or under uncommitted changes says so).
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(command: Sequence[str]) -> dict[str, object]:
    """The command, commit (and the tracked files that differed from it: a figure measured under
    uncommitted code says which), CPU, torch's threads, the 1-minute load average when it finished, and
    the time."""
    import torch  # heavy: imported only when a figure is written

    return {
        "command": " ".join(command),
        "commit": _git("rev-parse", "HEAD") or "unknown",
        "uncommitted_changes": _git("diff", "HEAD", "--name-only").split(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_1min": round(os.getloadavg()[0], 2),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
