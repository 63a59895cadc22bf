"""Where local data lives. Everything goes under one folder, ``$STUDIO_VAR`` (default ``./var``)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    """The folder for all local state: databases, caches, models, checkpoints."""
    return Path(os.environ.get("STUDIO_VAR", REPO_ROOT / "var")).resolve()


def cache_dir(*parts: str) -> Path:
    """A cache folder under ``var/cache`` (created on first use); safe to delete."""
    path = var_dir().joinpath("cache", *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Where prepared model checkpoints live (``$STUDIO_MODELS`` or ``var/models``)."""
    path = Path(os.environ.get("STUDIO_MODELS", var_dir() / "models")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
