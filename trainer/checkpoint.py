"""Checkpoints: one ``Checkpointer`` per run writes and loads them; this module alone knows their format.

Layout of one checkpoint (``<out>/checkpoints/step-000012/``)::

    actor/          the actor as a Hugging Face model folder (safetensors + tokenizer): loadable by any engine
                    (a LoRA actor: its merged weights)
    actor_lora/     a LoRA actor's adapter in PEFT's format, which a resume loads (``trainer.lora``)
    optimizer.pt    AdamW state
    rng.pt          Python, NumPy and torch RNG states
    state.json      {"step", "engine_version", "elapsed_s", "config"}
    extractor/      methods that use experience: state.pt (the extractor track's state: credit buffer,
                    counters, unfinished work, and πϕ's AdamW state); when πϕ trains, its model folder
                    (a LoRA πϕ: its adapter) and version.json

A run whose models are sharded over a torchrun group (``trainer.parallel``) saves their weights and
optimiser state with ``torch.distributed.checkpoint`` instead (``save_sharded``: a ``dcp/`` folder, and
``extractor/dcp/`` for πϕ, one file per rank plus DCP's metadata, in place of ``optimizer.pt``, the adapter
and πϕ's AdamW state in ``state.pt``), loadable into any number of ranks (``load_sharded``); the whole
models are still saved as Hugging Face folders beside them.

A checkpoint is written to a temporary folder and renamed into place, so a crash never leaves a half
checkpoint that looks complete. Resuming requires the same config as the checkpoint's; only ``steps``
(where to stop) may differ, so a finished run can be extended.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from trainer import lora, parallel
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


# ---- the one writer and reader of a run's checkpoints ----------------------------------------------

EXTRACTOR_DIR = "extractor"
"""πϕ's part of a checkpoint (methods that use experience)."""
TRACK_STATE_FILE = "state.pt"
"""The extractor track's state in ``extractor/``: πϕ's optimiser (one process), credit buffer, counters and
unfinished work."""


class Trained(Protocol):
    """A model under training and its optimiser (``ActorUpdate``, ``ExtractorUpdate``)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer


class TrackState(Protocol):
    """The extractor track's side of a checkpoint (``trainer.extractor.track.ExtractorTrack``)."""

    update_lock: Any

    def settle_credits(self) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class Checkpointer:
    """Writes and loads every checkpoint of one run: built once from its models (``trainer.assemble``); the
    loop calls ``save`` alone. ``sharded`` (the placement's ``distributed``): the models are sharded over a
    torchrun group, so weights and optimiser state go through DCP and every rank calls ``save`` and
    ``load``; else one process writes the plain format. Both hold the whole actor as a Hugging Face
    folder, RNG states and ``state.json``, so either format evaluates and serves alike."""

    out_dir: Path
    cfg: RunConfig
    actor: Trained
    tokenizer: Any
    sharded: bool = False
    extractor: Any = None
    """πϕ at inference (``trainer.extractor.model.Extractor``): its tokenizer and weight version are saved
    beside its weights when it trains."""
    extractor_update: Trained | None = None
    """πϕ's trainer when the method trains it."""
    track: TrackState | None = None
    """The extractor track (rank 0 of a method that uses experience; ``attach_track``)."""

    def attach_track(self, track: TrackState, state: CheckpointState | None) -> None:
        """Keep ``track``'s state in every checkpoint from now on, resuming it from ``state``'s first (and,
        on one process, πϕ's optimiser state, which is in the same file)."""
        self.track = track
        saved = read_track_state(state.path) if state is not None else None
        if saved is None:
            return
        update = self.extractor_update
        if update is not None and not self.sharded and saved.get("optimizer") is not None:
            with track.update_lock:
                update.optimizer.load_state_dict(saved["optimizer"])
        track.load_state_dict(saved)

    def save(self, step: int, *, engine_version: int, elapsed_s: float) -> Path:
        """Write the checkpoint of ``step`` and prune the old ones; returns its folder. Written into a
        temporary folder that rank 0 renames into place once every part is in. ``out_dir`` must be one
        folder for every rank (on several nodes: a shared filesystem)."""
        final = checkpoint_dir(self.out_dir, step)
        tmp = final.with_name(final.name + ".partial")
        main = parallel.is_main()
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        self._save_actor(tmp)
        self._save_extractor(tmp / EXTRACTOR_DIR)
        if main:
            torch.save(_rng_states(), tmp / "rng.pt")
            state = dict(
                step=step, engine_version=engine_version, elapsed_s=elapsed_s, config=self.cfg.to_dict()
            )
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            prune_checkpoints(self.out_dir, self.cfg.checkpoint_keep)
        self._barrier()
        return final

    def load(self, state: CheckpointState | None) -> None:
        """Load ``state``'s weights, optimiser states and RNG states into this run's objects (in place;
        nothing when not resuming). A plain πϕ's weights came with its model
        (``trainer.assemble.load_extractor_model``); the extractor track's state comes with
        ``attach_track``."""
        if state is None:
            return
        if self.sharded:
            self._load_shards(state.path)
        else:
            _load_plain_actor(state.path, self.actor)
        _set_rng_states(torch.load(state.path / "rng.pt", weights_only=False))

    def _load_shards(self, checkpoint: Path) -> None:
        """The actor's and a training πϕ's weights and AdamW states from their DCP folders, resharded to
        this group (every rank calls it)."""
        if not (checkpoint / SHARDED_DIR).is_dir():
            raise ValueError(
                f"checkpoint {checkpoint} has no {SHARDED_DIR}/ folder: it was saved by one process; resume "
                "it with nproc = 1"
            )
        load_sharded(checkpoint / SHARDED_DIR, self.actor.model, self.actor.optimizer)
        if self.extractor_update is not None:
            x = self.extractor_update
            load_sharded(checkpoint / EXTRACTOR_DIR / SHARDED_DIR, x.model, x.optimizer)

    def _barrier(self) -> None:
        if self.sharded:  # every rank's part in place before rank 0 renames the folder
            parallel.barrier()

    def _save_actor(self, folder: Path) -> None:
        """The actor as a Hugging Face folder that any engine loads, and what a resume loads: its DCP
        shards (every rank), or its optimiser state (and a LoRA actor's adapter) from the one process."""
        model, optimizer = self.actor.model, self.actor.optimizer
        if self.sharded:
            save_sharded(folder / SHARDED_DIR, model, optimizer)
            weights = parallel.full_state_dict(model)  # a collective: every rank gathers, rank 0 writes
            if parallel.is_main():
                model.save_pretrained(folder / "actor", state_dict=weights, safe_serialization=True)
        elif lora.is_lora(model):  # the merged model, which any engine loads, and the adapter a resume loads
            lora.save_merged(model, folder / "actor")
            lora.save_adapter(model, folder / lora.ADAPTER_DIR)
        else:
            model.save_pretrained(folder / "actor", safe_serialization=True)
        if parallel.is_main():
            self.tokenizer.save_pretrained(folder / "actor")
        if not self.sharded:
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")

    def _save_extractor(self, folder: Path) -> None:
        """πϕ's part: a sharded πϕ's shards (every rank) and whole model (rank 0); from rank 0's track, its
        state (credits settled first) and, on one process, πϕ's weights, under the track's lock so that
        they are whole; πϕ's tokenizer and weight version when it trains."""
        update = self.extractor_update
        if self.sharded and update is not None:
            save_sharded(folder / SHARDED_DIR, update.model, update.optimizer)
            weights = parallel.full_state_dict(update.model)  # a collective
            if parallel.is_main():
                update.model.save_pretrained(folder, state_dict=weights, safe_serialization=True)
        if self.track is None:
            return
        folder.mkdir(exist_ok=True)
        with self.track.update_lock:
            self.track.settle_credits()
            owned = update is not None and not self.sharded  # a sharded πϕ's AdamW state is in its shards
            optimizer = update.optimizer.state_dict() if owned else None
            torch.save({"optimizer": optimizer, **self.track.state_dict()}, folder / TRACK_STATE_FILE)
            if owned:
                update.model.save_pretrained(folder, safe_serialization=True)
        if update is None:
            return
        self.extractor.tokenizer.save_pretrained(folder)
        (folder / "version.json").write_text(json.dumps({"weight_version": self.extractor.expected_version}))


def read_track_state(checkpoint: Path) -> dict | None:
    """The extractor track's state in ``checkpoint`` (None: it has none)."""
    path = Path(checkpoint) / EXTRACTOR_DIR / TRACK_STATE_FILE
    return torch.load(path, weights_only=False) if path.exists() else None


def _load_plain_actor(checkpoint: Path, actor: Trained) -> None:
    """Weights and optimiser state saved by one process. A LoRA model loads its adapter (``actor_lora/``)
    onto the base weights it was built from."""
    from safetensors.torch import load_file

    model = actor.model
    if lora.is_lora(model):
        lora.load_adapter(model, checkpoint / lora.ADAPTER_DIR)
    else:
        weights: dict[str, torch.Tensor] = {}
        for f in sorted((checkpoint / "actor").glob("*.safetensors")):
            weights |= load_file(f)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        missing = [k for k in missing if k not in getattr(model, "_tied_weights_keys", ())]
        if missing or unexpected:
            raise ValueError(
                f"checkpoint {checkpoint} does not fit the actor model (missing {missing[:5]}, unexpected "
                f"{list(unexpected)[:5]})"
            )
    actor.optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=False))


def _rng_states() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_states(rng: dict[str, Any]) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
