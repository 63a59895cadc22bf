"""One rank of the resharding tests (``test_checkpoint_reshard.py``): a run's checkpoint written by one number
of processes and loaded by another, through the run's ``Checkpointer``. Run as ``python reshard_worker.py``
(one plain process) or under ``torchrun --nproc-per-node 2`` (FSDP2 over gloo).

``save OUT``: the actor (``dist_worker``'s tiny Llama) takes two split-GRPO steps and πϕ (another tiny
Llama) two CISPO steps; the checkpointer saves (with an extractor track's state on rank 0 and the RNG seeded
just before); then each takes another step: the run that never stopped. ``resume OUT CHECKPOINT``: new
processes build both models from other random weights (πϕ from the checkpoint's folder, as
``trainer.assemble`` does), the checkpointer loads the checkpoint, and both take that next step. Each
mode records the weights and AdamW states right after the save or load, a draw of the RNG, and the weights
after the next steps; rank 0 writes ``OUT/<mode>-<world size>.pt``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from transformers import PreTrainedTokenizerFast

from tests.trainer import dist_worker as tiny
from trainer import parallel
from trainer.actor import ActorUpdate
from trainer.assemble import load_extractor_model
from trainer.checkpoint import EXTRACTOR_DIR, Checkpointer, check_resumable, read_checkpoint
from trainer.config import get_preset
from trainer.extractor.update import ExtractorUpdate


class Track:
    """The extractor track's side of a checkpoint: a state that must come back."""

    def __init__(self, state: dict) -> None:
        self.update_lock = threading.Lock()
        self.state = state

    def settle_credits(self) -> None:
        pass

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = {k: v for k, v in state.items() if k != "optimizer"}


class Extractor:
    """What the checkpointer saves of πϕ at inference: its tokenizer and weight version."""

    expected_version = 3

    def __init__(self) -> None:
        vocab = Tokenizer(WordLevel({"[UNK]": 0, "go": 1}, unk_token="[UNK]"))
        self.tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocab, unk_token="[UNK]")


def optimizer_state(update) -> dict:
    """The AdamW state, whole and keyed by parameter name (a collective when sharded)."""
    options = StateDictOptions(full_state_dict=True)
    state = get_optimizer_state_dict(update.model, update.optimizer, options=options)
    return {name: {k: v.clone() for k, v in s.items()} for name, s in state["state"].items()}


def snapshot(actor, update) -> dict:
    return {
        "actor_weights": tiny.weights(actor.model),
        "actor_optimizer": optimizer_state(actor),
        "extractor_weights": tiny.weights(update.model),
        "extractor_optimizer": optimizer_state(update),
    }


def second_steps(actor, update, result: dict) -> None:
    actor.step(tiny.actor_batch(tiny.tiny_llama(0)))
    update.step(tiny.extractor_batch(tiny.tiny_llama(1)), tiny._Prompts())  # type: ignore[arg-type]
    result["actor_weights_2"] = tiny.weights(actor.model)
    result["extractor_weights_2"] = tiny.weights(update.model)


def actor_update(placement, seed: int) -> ActorUpdate:
    return ActorUpdate(
        parallel.parallelize(tiny.tiny_llama(seed), placement), tiny.ACTOR, estimator="grpo_split"
    )


def extractor_update(placement, plain) -> ExtractorUpdate:
    return ExtractorUpdate(
        parallel.parallelize(plain, placement, activation_checkpointing=True), tiny.EXTRACTOR
    )


def run_save(placement, out: Path) -> dict:
    actor = actor_update(placement, 0)
    update = extractor_update(placement, tiny.tiny_llama(1))
    for _ in range(2):  # AdamW's step count 2: not the 1 of an optimiser state made up at load
        actor.step(tiny.actor_batch(tiny.tiny_llama(0)))
        update.step(tiny.extractor_batch(tiny.tiny_llama(1)), tiny._Prompts())  # type: ignore[arg-type]
    cfg = get_preset("cpu").with_overrides(nproc=placement.world_size)
    checkpointer = Checkpointer(
        out, cfg, actor, Extractor().tokenizer, placement.distributed, Extractor(), update
    )
    if placement.rank == 0:
        checkpointer.attach_track(Track({"credits": [1, 2, 3], "distilled": 7}), None)  # type: ignore[arg-type]
    torch.manual_seed(1234)
    checkpointer.save(1, engine_version=2, elapsed_s=5.0)
    result = {"rand": torch.rand(4)} | snapshot(actor, update)
    second_steps(actor, update, result)
    return result


def run_resume(placement, out: Path, checkpoint: Path) -> dict:
    state = read_checkpoint(checkpoint)
    cfg = get_preset("cpu").with_overrides(nproc=placement.world_size)
    check_resumable(state.config, cfg)  # another process count is no other config
    actor = actor_update(placement, 5)  # other weights: all of them must come from the checkpoint
    update = extractor_update(placement, load_extractor_model(tiny.EXTRACTOR, state.path / EXTRACTOR_DIR))
    extractor = Extractor()
    checkpointer = Checkpointer(
        out, cfg, actor, extractor.tokenizer, placement.distributed, extractor, update
    )
    checkpointer.load(state)
    result = {"rand": torch.rand(4)}
    if placement.rank == 0:
        track = Track({})
        checkpointer.attach_track(track, state)  # type: ignore[arg-type]
        result["track"] = track.state
    result |= snapshot(actor, update)
    second_steps(actor, update, result)
    return result


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    placement = parallel.init_distributed("cpu")
    result = run_save(placement, out) if mode == "save" else run_resume(placement, out, Path(sys.argv[3]))
    if placement.rank == 0:
        torch.save(result, out / f"{mode}-{placement.world_size}.pt")
    parallel.barrier()  # every rank leaves the group together (dist_worker.py says why)
    parallel.destroy()


if __name__ == "__main__":
    main()
