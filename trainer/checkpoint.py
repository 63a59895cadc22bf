"""Checkpoints: the actor, its optimiser, RNG states, the step, the engine version and the config.

Layout of one checkpoint (``<out>/checkpoints/step-000012/``)::

    actor/          the actor as a Hugging Face model folder (safetensors + tokenizer): loadable by any engine
                    (a LoRA actor: its merged weights)
    actor_lora/     a LoRA actor's adapter in PEFT's format, which a resume loads (``trainer.lora``)
    optimizer.pt    AdamW state
    rng.pt          Python, NumPy and torch RNG states
    state.json      {"step", "engine_version", "elapsed_s", "config"}
    extractor/      methods that train πϕ: its model folder, version.json, state.pt (AdamW state and the
                    credit buffer), written by ``trainer.coevolution``

A model sharded over several ranks (``trainer.parallel``) saves its weights and optimiser state with
``torch.distributed.checkpoint`` instead (``save_sharded``: a ``dcp/`` folder beside the others, one file
per rank plus DCP's metadata), loadable into any number of ranks (``load_sharded``).

A checkpoint is written to a temporary folder and renamed into place, so a crash never leaves a half
checkpoint that looks complete. Resuming requires the same config as the checkpoint's; only ``steps``
(where to stop) may differ, so a finished run can be extended.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import lora
from trainer.config import ConfigError, RunConfig

STATE_FILE = "state.json"
RESUMABLE_DIFFERENCES = (
    "steps",
    "eval_every",
    "checkpoint_every",
    "checkpoint_keep",
    "checkpoint_minutes",
    "tracking.tensorboard",
    "device",
)
"""Config keys a resumed run may change: where it stops, when it evaluates and checkpoints, what it logs,
and what it runs on (a run saved on a GPU may go on on the CPU)."""


@dataclass(frozen=True)
class CheckpointState:
    step: int
    """The last finished actor step."""
    engine_version: int
    """The weight version the engine served after that step's sync."""
    config: RunConfig
    path: Path
    elapsed_s: float = 0.0
    """Seconds the run had trained when it was saved (``trainer.report.RunClock``), over all its attempts;
    0 for a checkpoint saved before they were kept."""
    new_settings: dict[str, Any] = field(default_factory=dict)
    """Settings the checkpoint's config lacks (saved before they existed), with the defaults they take."""


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step-{step:06d}"


def save_checkpoint(
    out_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    engine_version: int,
    elapsed_s: float,
    config: RunConfig,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` under ``out_dir``; returns its folder. ``extra`` writes more parts
    (the extractor's) into the folder before it is renamed into place."""
    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if lora.is_lora(model):  # the merged model, which any engine loads, and the adapter a resume loads
        lora.save_merged(model, tmp / "actor")
        lora.save_adapter(model, tmp / lora.ADAPTER_DIR)
    else:
        model.save_pretrained(tmp / "actor", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "actor")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(rng, tmp / "rng.pt")
    state = dict(step=step, engine_version=engine_version, elapsed_s=elapsed_s, config=config.to_dict())
    if extra is not None:
        extra(tmp)
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def prune_checkpoints(out_dir: Path, keep: int) -> list[Path]:
    """Delete all but the latest ``keep`` complete checkpoints under ``out_dir`` (``keep`` 0: none);
    returns the deleted folders. Called after a save, so the newest one is always complete."""
    if keep < 1:
        return []
    done = sorted(p for p in (Path(out_dir) / "checkpoints").glob("step-*[0-9]") if (p / STATE_FILE).exists())
    old = done[:-keep]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def find_checkpoint(path: Path) -> Path:
    """``path`` itself when it is a checkpoint; else the latest checkpoint under it (a run's out dir)."""
    path = Path(path)
    if (path / STATE_FILE).exists():
        return path
    found = sorted((path / "checkpoints").glob("step-*[0-9]")) + sorted(path.glob("step-*[0-9]"))
    found = [p for p in found if (p / STATE_FILE).exists()]
    if not found:
        raise FileNotFoundError(f"no checkpoint in {path} (expected {STATE_FILE} or checkpoints/step-*/)")
    return max(found, key=lambda p: p.name)


def read_checkpoint(path: Path) -> CheckpointState:
    path = find_checkpoint(path)
    state = json.loads((path / STATE_FILE).read_text())
    config = RunConfig.from_dict(state["config"])
    changes = config_changes(state["config"], config.to_dict())  # only keys the saved config lacks
    return CheckpointState(
        step=int(state["step"]),
        engine_version=int(state["engine_version"]),
        config=config,
        path=path,
        elapsed_s=float(state.get("elapsed_s", 0.0)),
        new_settings={key: now for key, then, now in changes if then is UNSET},
    )


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


UNSET = "(not a setting then)"
"""How ``config_changes`` shows a key the older config lacks (saved before the setting existed)."""


def config_changes(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every setting (dotted key) whose value differs between two configs' dicts, ``steps`` aside, as
    (key, saved value, wanted value); a key missing from one side shows as ``UNSET``."""
    a, b = _flat(dict(saved)), _flat(dict(wanted))
    return [
        (k, a.get(k, UNSET), b.get(k, UNSET))
        for k in sorted(a.keys() | b.keys())
        if a.get(k, UNSET) != b.get(k, UNSET) and k not in RESUMABLE_DIFFERENCES
    ]


def check_resumable(saved: RunConfig, wanted: RunConfig) -> None:
    """Refuse to resume a checkpoint under a different config (``steps`` aside), naming every change."""
    changed = config_changes(saved.to_dict(), wanted.to_dict())
    if changed:
        diffs = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, a, b in changed)
        raise ConfigError(
            f"cannot resume: the config differs from the checkpoint's ({diffs}). Resume with the same "
            "config (only 'steps' may change), or start a new run."
        )


def load_checkpoint(
    state: CheckpointState, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load weights, optimiser and RNG states of ``state`` into the given objects (in place). A LoRA
    model loads its adapter (``actor_lora/``) onto the base weights it was built from."""
    from safetensors.torch import load_file

    if lora.is_lora(model):
        lora.load_adapter(model, state.path / lora.ADAPTER_DIR)
        _load_optimizer_and_rng(state, optimizer)
        return
    weights: dict[str, torch.Tensor] = {}
    for f in sorted((state.path / "actor").glob("*.safetensors")):
        weights |= load_file(f)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k not in getattr(model, "_tied_weights_keys", ())]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {state.path} does not fit the actor model (missing {missing[:5]}, unexpected "
            f"{list(unexpected)[:5]})"
        )
    _load_optimizer_and_rng(state, optimizer)


def _load_optimizer_and_rng(state: CheckpointState, optimizer: torch.optim.Optimizer) -> None:
    optimizer.load_state_dict(torch.load(state.path / "optimizer.pt", weights_only=False))
    rng = torch.load(state.path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])


# ---- sharded models (torch.distributed.checkpoint) -------------------------------------------------

SHARDED_DIR = "dcp"
"""The DCP folder inside a checkpoint of a sharded run."""


def save_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Save weights and optimiser state with DCP, each rank its own shards (every rank calls it). Works
    unsharded in one process too. Returns ``folder``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(folder))
    return Path(folder)


def load_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a ``save_sharded`` folder into ``model`` and ``optimizer`` in place, resharding to however
    many ranks run now (every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # DCP loads in place into tensors of the right shapes and shardings: this process's own state dicts
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def save_sharded_checkpoint(
    out_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    engine_version: int,
    elapsed_s: float,
    config: RunConfig,
    extra: Callable[[Path], None] | None = None,
    shards: Callable[[Path], None] | None = None,
) -> Path:
    """``save_checkpoint`` for a model sharded over a torchrun group (every rank calls it): weights and
    optimiser state in ``dcp/`` (each rank its shards), the whole actor as a Hugging Face folder too (any
    engine or evaluation loads it), RNG states and ``state.json`` from rank 0; what every rank's ``shards``
    writes (πϕ's shards) and what rank 0's ``extra`` writes (the extractor track's state, which lives on
    rank 0). ``out_dir`` must be one folder for every rank (on several nodes: a shared filesystem)."""
    from trainer import parallel

    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(final.name + ".partial")
    main = parallel.is_main()
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    parallel.barrier()
    save_sharded(tmp / SHARDED_DIR, model, optimizer)
    weights = parallel.full_state_dict(model)  # a collective: every rank gathers, rank 0 writes
    if shards is not None:
        shards(tmp)
    if main:
        model.save_pretrained(tmp / "actor", state_dict=weights, safe_serialization=True)
        tokenizer.save_pretrained(tmp / "actor")
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        torch.save(rng, tmp / "rng.pt")
        state = dict(step=step, engine_version=engine_version, elapsed_s=elapsed_s, config=config.to_dict())
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        if extra is not None:
            extra(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    parallel.barrier()
    return final


def load_sharded_checkpoint(
    state: CheckpointState, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """``load_checkpoint`` for a sharded model (every rank calls it): its ``dcp/`` folder, resharded to
    this group, and rank 0's RNG states."""
    folder = state.path / SHARDED_DIR
    if not folder.is_dir():
        raise ValueError(
            f"checkpoint {state.path} has no {SHARDED_DIR}/ folder: it was saved by one process; resume it "
            "with nproc = 1"
        )
    load_sharded(folder, model, optimizer)
    rng = torch.load(state.path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
