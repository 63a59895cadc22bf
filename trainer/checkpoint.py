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
and πϕ's AdamW state in ``state.pt``); the whole models are still saved as Hugging Face folders beside
them, gathered to rank 0 alone (``parallel.main_state_dict``: a helper rank never holds a whole copy).

Either format loads into any number of processes (``Checkpointer.load``): DCP folders reshard themselves
to the group that loads them, or to one plain process (``load_sharded``); plain files load into a sharded
group through ``torch.distributed.checkpoint.state_dict``'s full state dicts, read by rank 0 and
broadcast tensor by tensor (``load_full``). So a run saved on 2 processes resumes on 1 or on 8.

A checkpoint is written to a temporary folder and renamed into place, so a crash never leaves a half
checkpoint that looks complete. Resuming requires the same config as the checkpoint's; only where to stop
and what only says where the run runs (``RESUMABLE_DIFFERENCES``: the process count and device among them)
may differ, so a finished run can be extended and a run can go on on other hardware.
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
    "nproc",
    "collective_timeout_s",
    "actor.gradient_checkpointing",
    "extractor.gradient_checkpointing",
    "rollout.kv_cache_gib",
    "extractor.kv_cache_gib",
)
"""Config keys a resumed run may change: where it stops, when it evaluates and checkpoints, what it logs,
and what it runs on, which changes what the run holds where but not what it computes: the device (a run
saved on a GPU may go on on the CPU), the process count (``Checkpointer.load`` reshards), how long a rank
waits for the others, activation checkpointing (recomputed activations are the same) and the engines' KV
cache sizes."""


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


def flat_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's dict as dotted keys (``actor.lr``) and their values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= flat_config(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


UNSET = "(not a setting then)"
"""How ``config_changes`` shows a key the older config lacks (saved before the setting existed)."""


def config_changes(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every setting (dotted key) whose value differs between two configs' dicts, ``steps`` aside, as
    (key, saved value, wanted value); a key missing from one side shows as ``UNSET``."""
    a, b = flat_config(dict(saved)), flat_config(dict(wanted))
    return [
        (k, a.get(k, UNSET), b.get(k, UNSET))
        for k in sorted(a.keys() | b.keys())
        if a.get(k, UNSET) != b.get(k, UNSET) and k not in RESUMABLE_DIFFERENCES
    ]


def check_resumable(saved: RunConfig, wanted: RunConfig) -> None:
    """Refuse to resume a checkpoint under a different config (``RESUMABLE_DIFFERENCES`` aside), naming
    every change."""
    changed = config_changes(saved.to_dict(), wanted.to_dict())
    if changed:
        diffs = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, a, b in changed)
        raise ConfigError(
            f"cannot resume: the config differs from the checkpoint's ({diffs}). Resume with the same "
            "config (only 'steps', the process count, the device and what only says when to evaluate, "
            "checkpoint or log may change), or start a new run."
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
    many ranks run now, or into one plain process's unsharded model (every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # DCP loads in place into tensors of the right shapes and shardings: this process's own state dicts
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_full(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    weights: dict[str, torch.Tensor] | None,
    optim_state: dict | None,
) -> None:
    """Whole (unsharded) weights and a one-process optimiser state (``optimizer.state_dict()``: keyed by
    parameter number) into a sharded model and its optimiser, in place (every rank calls it). Rank 0 alone
    passes them (read from the plain files); it broadcasts one tensor at a time and each rank keeps its
    shard (``StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)``), so no helper rank holds a
    whole copy. ``weights`` None: the model keeps its own (a πϕ that loaded them before it was sharded)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    main = parallel.is_main()
    if parallel.broadcast_object(weights is not None if main else None):
        set_model_state_dict(model, _with_tied(model, weights) if main else {}, options=options)
    state = _by_name(model, optimizer, optim_state) if main and optim_state is not None else {}
    set_optimizer_state_dict(model, optimizer, state, options=options)


def _with_tied(model: torch.nn.Module, weights: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """``weights`` with every name of a tied parameter (a Hugging Face folder keeps one: the embedding,
    not the head that shares it)."""
    weights = dict(weights or {})
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for same in names.values():
        held = next((n for n in same if n in weights), None)
        for name in same:
            if held is not None and name not in weights:
                weights[name] = weights[held]
    return weights


def _by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """A one-process ``optimizer.state_dict()`` (parameters numbered in the optimiser's order) keyed by
    parameter name, as ``torch.distributed.checkpoint.state_dict`` takes it: ``optimizer`` holds the same
    parameters in the same order, sharded (FSDP2 keeps the names)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    names = [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
    numbers = [i for group in saved["param_groups"] for i in group["params"]]
    if len(numbers) != len(names):
        raise ValueError(
            f"the checkpoint's optimiser holds {len(numbers)} parameters, this model trains {len(names)}"
        )
    name = dict(zip(numbers, names, strict=True))
    groups = [g | {"params": [name[i] for i in g["params"]]} for g in saved["param_groups"]]
    return {"state": {name[i]: s for i, s in saved["state"].items()}, "param_groups": groups}


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
        model, optimizer = self.actor.model, self.actor.optimizer
        if (
            state.path / SHARDED_DIR
        ).is_dir():  # saved by a group: DCP reshards to this one, or to one process
            load_sharded(state.path / SHARDED_DIR, model, optimizer)
        elif self.sharded:  # saved by one process, resumed by a group
            main = parallel.is_main()
            weights = _plain_weights(state.path) if main else None
            load_full(model, optimizer, weights, _plain_optimizer(state.path) if main else None)
        else:
            _load_plain_actor(state.path, self.actor)
        self._load_extractor_optimizer(state.path)
        _set_rng_states(torch.load(state.path / "rng.pt", weights_only=False))

    def _load_extractor_optimizer(self, checkpoint: Path) -> None:
        """A training πϕ's AdamW state (and weights) from its DCP folder, resharded to this group or to one
        process; a one-process checkpoint's, which ``state.pt`` holds, into a group's shards. One process
        resuming one process's checkpoint gets it with ``attach_track`` instead. Every rank calls it."""
        x = self.extractor_update
        if x is None:
            return
        if (checkpoint / EXTRACTOR_DIR / SHARDED_DIR).is_dir():
            load_sharded(checkpoint / EXTRACTOR_DIR / SHARDED_DIR, x.model, x.optimizer)
        elif self.sharded and (checkpoint / EXTRACTOR_DIR / TRACK_STATE_FILE).exists():
            saved = (read_track_state(checkpoint) or {}).get("optimizer") if parallel.is_main() else None
            load_full(x.model, x.optimizer, None, saved)  # its weights came with its model

    def _barrier(self) -> None:
        if self.sharded:  # every rank's part in place before rank 0 renames the folder
            parallel.barrier()

    def _save_actor(self, folder: Path) -> None:
        """The actor as a Hugging Face folder that any engine loads, and what a resume loads: its DCP
        shards (every rank), or its optimiser state (and a LoRA actor's adapter) from the one process."""
        model, optimizer = self.actor.model, self.actor.optimizer
        if self.sharded:
            save_sharded(folder / SHARDED_DIR, model, optimizer)
            weights = parallel.main_state_dict(model)  # a collective: whole on rank 0, which writes
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
            weights = parallel.main_state_dict(update.model)  # a collective: whole on rank 0 alone
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


def _plain_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole actor's weights of a checkpoint, from its Hugging Face folder (a tied head left out)."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in sorted((checkpoint / "actor").glob("*.safetensors")):
        weights |= load_file(f)
    return weights


def _plain_optimizer(checkpoint: Path) -> dict:
    """The actor's AdamW state saved by one process."""
    return torch.load(checkpoint / "optimizer.pt", weights_only=False)


def _load_plain_actor(checkpoint: Path, actor: Trained) -> None:
    """Weights and optimiser state saved by one process, into one process. A LoRA model loads its adapter
    (``actor_lora/``) onto the base weights it was built from."""
    model = actor.model
    if lora.is_lora(model):
        lora.load_adapter(model, checkpoint / lora.ADAPTER_DIR)
    else:
        weights = _plain_weights(checkpoint)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        missing = [k for k in missing if k not in getattr(model, "_tied_weights_keys", ())]
        if missing or unexpected:
            raise ValueError(
                f"checkpoint {checkpoint} does not fit the actor model (missing {missing[:5]}, unexpected "
                f"{list(unexpected)[:5]})"
            )
    actor.optimizer.load_state_dict(_plain_optimizer(checkpoint))


def _rng_states() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_states(rng: dict[str, Any]) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
