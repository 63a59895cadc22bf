"""Frozen evaluation splits: a JSON file of instances beside a checksum file.

An eval split is generated once, committed under ``trainer/envs/splits/`` and then only read:
``load_split`` refuses a file whose checksum does not match, so a silently regenerated or edited
split cannot change reported results.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

SPLITS_DIR = Path(__file__).parent / "splits"


class SplitChecksumError(RuntimeError):
    pass


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_path(env_name: str, split: str = "eval") -> Path:
    return SPLITS_DIR / f"{env_name}.{split}.json"


def write_split(path: Path, instances: list[Any]) -> str:
    """Write ``instances`` and its checksum; return the checksum."""
    data = json.dumps(instances, indent=1, sort_keys=True).encode() + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    digest = _digest(data)
    path.with_suffix(".sha256").write_text(f"{digest}  {path.name}\n")
    return digest


def load_split(path: Path) -> list[Any]:
    """Read a frozen split, verifying its checksum."""
    data = path.read_bytes()
    expected = path.with_suffix(".sha256").read_text().split()[0]
    if _digest(data) != expected:
        raise SplitChecksumError(
            f"{path} does not match its checksum {expected[:12]}…: the frozen split was changed. "
            "Restore it from git; regenerate only on purpose, and say so in the results."
        )
    return json.loads(data)
