"""One rank of the parity and resume tests (``test_parallel.py``): run as ``python dist_worker.py`` (one
process, unsharded) or ``torchrun --nproc-per-node 2 dist_worker.py`` (two ranks, FSDP2 over gloo).

A small random-initialised Llama (tied embeddings, like SmolLM2) built from a config, float32, seed 0.
``steps OUT``: one actor split-GRPO step and one extractor CISPO step, recording the loss, the gathered
gradients (after clipping, as the optimiser sees them) and the weights; then the actor saves a DCP
checkpoint and steps again (the uninterrupted second step). ``resume OUT``: new processes load that
checkpoint and take the second step. ``retrieval OUT MODEL``: guided and free episodes on MODEL (an HF
engine per rank) whose experiences rank 0's recording retriever serves to every rank and whose guided
episodes ask the bank mid-episode (issue 47); ``serve_error OUT``: rank 0's server fails while both ranks
wait for it. Rank 0 writes ``OUT/<name>.pt``. (Each rank sampling its share with its own vLLM engine as
one engine does: ``test_parallel_parity.py``.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainer import parallel
from trainer.actor import ActorUpdate
from trainer.checkpoint import load_sharded, save_sharded
from trainer.config import ActorConfig, ExtractorConfig
from trainer.extractor.credit import Batch, Record
from trainer.extractor.update import ExtractorUpdate
from trainer.rollout.base import sequence_logprobs
from trainer.rollout.runner import Episode, EpisodeSpec, Segment
from trainer.store import Generation

VOCAB = 256
LR = 1e-5
ACTOR = ActorConfig(lr=LR, micro_batch_size=2, gradient_checkpointing=False)
EXTRACTOR = ExtractorConfig(lr=LR, micro_batch_size=2, gradient_checkpointing=True)
"""Checkpointing on for the extractor: Hugging Face's in one process, ``apply_ac``'s when sharded."""


def tiny_llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).float()


def _segment(model, gen: torch.Generator, n_prompt: int, turns: list[int]) -> Segment:
    """A prompt, then actor turns (mask 1) separated by observations (mask 0); engine log-probs are the
    model's own, as a synced engine would give."""
    ids = lambda n: torch.randint(3, VOCAB, (n,), generator=gen).tolist()  # noqa: E731
    seg = Segment(prompt_ids=ids(n_prompt))
    for i, n in enumerate(turns):
        seg.response_ids += ids(n)
        seg.mask += [1] * n
        if i < len(turns) - 1:
            seg.response_ids += ids(5)
            seg.mask += [0] * 5
    with torch.no_grad():
        (lp,) = sequence_logprobs(model, [seg.prompt_ids], [seg.response_ids])
    seg.engine_logprobs = [x if m else 0.0 for x, m in zip(lp.tolist(), seg.mask, strict=True)]
    return seg


def actor_batch(model) -> list[Episode]:
    """2 task instances x 4 rollouts (2 guided, 2 free), mixed rewards, one episode in two segments."""
    gen = torch.Generator().manual_seed(1)
    rewards = [[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]]
    episodes = []
    for group, rs in enumerate(rewards):
        for k, r in enumerate(rs):
            segs = [_segment(model, gen, 12 + 3 * k, [4 + k, 3])]
            if group == 1 and k == 2:  # as after a context rebuild
                segs.append(_segment(model, gen, 20, [6]))
            spec = EpisodeSpec("tiny", seed=group, group=group, guided=k < 2)
            episodes.append(Episode(spec, "", "", None, [], segs, r, r > 0, False, [0], 0.0))
    return episodes


class _Prompts:
    """The part of ``Extractor`` the update reads: prompt token ids and the synced weight version."""

    expected_version = 0

    def prompt_ids(self, prompt: str) -> list[int]:
        return [3 + (ord(c) % (VOCAB - 3)) for c in prompt]


def extractor_batch(model) -> Batch:
    gen = torch.Generator().manual_seed(2)
    prompts = _Prompts()
    records = []
    for i in range(7):
        prompt = f"distil episode {i}: " + "abcdefgh"[: 1 + i]
        ids = torch.randint(3, VOCAB, (5 + 2 * i,), generator=gen).tolist()
        with torch.no_grad():
            (lp,) = sequence_logprobs(model, [prompts.prompt_ids(prompt)], [ids])
        old = (lp + 0.05 * torch.randn(len(ids), generator=gen)).tolist()  # an off-policy sample
        records.append(Record(f"g{i}", Generation(prompt, "", tuple(ids), tuple(old), 0), "distil"))
    rewards = torch.tensor([1.0, -1.0, 1 / 3, -1.0, 1.0, 0.0, -1 / 3])
    weights = torch.tensor([1.0, 1.0, 0.5, 0.0, 1.0, 1.0, 0.7])
    return Batch(records, rewards, weights * (rewards - rewards.mean()), weights, step=1)


def record_grads(update, out: dict) -> None:
    """Keep the gradients the optimiser steps on (gathered: a collective every rank joins)."""
    step = update.optimizer.step

    def recording_step(*args, **kwargs):
        out["grads"] = {n: parallel.full_tensor(p.grad) for n, p in update.model.named_parameters()}
        return step(*args, **kwargs)

    update.optimizer.step = recording_step


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.clone() for n, p in parallel.named_full_parameters(model)}


def run_steps(placement, out_dir: Path) -> dict:
    result: dict = {"world_size": placement.world_size}
    plain = tiny_llama(0)
    episodes = actor_batch(plain)
    model = parallel.parallelize(plain, placement)
    result["actor_initial"] = weights(model)
    actor = ActorUpdate(model, ACTOR, estimator="grpo_split")
    record_grads(actor, result)
    result["actor_loss"] = actor.step(episodes)["actor/loss"]
    result["actor_grads"] = result.pop("grads")
    result["actor_weights"] = weights(model)
    save_sharded(out_dir / "dcp", model, actor.optimizer)
    actor.step(episodes)
    result["actor_weights_2"] = weights(model)

    plain = tiny_llama(1)
    batch = extractor_batch(plain)
    model = parallel.parallelize(plain, placement, activation_checkpointing=True)
    result["extractor_initial"] = weights(model)
    update = ExtractorUpdate(model, EXTRACTOR)
    record_grads(update, result)
    result["extractor_loss"] = update.step(batch, _Prompts())["extractor/loss"]
    result["extractor_grads"] = result.pop("grads")
    result["extractor_weights"] = weights(model)
    return result


def run_resume(placement, out_dir: Path) -> dict:
    plain = tiny_llama(5)  # other weights: all of them must come from the checkpoint
    episodes = actor_batch(tiny_llama(0))
    model = parallel.parallelize(plain, placement)
    actor = ActorUpdate(model, ACTOR, estimator="grpo_split")
    load_sharded(out_dir / "dcp", model, actor.optimizer)
    actor.step(episodes)
    return {"actor_weights_2": weights(model)}


class RecordingBank:
    """Stands for the experience bank behind the runner's ``Retriever`` protocol: its answers depend on
    everything it answered before (as the diversified re-rank's usage penalties do), and it records every
    call, so a call made in another order, split up, or on another rank shows."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str, str]]] = []
        self.served = 0

    def __call__(self, queries):
        from trainer.rollout.runner import Experience

        self.calls.append([(q.env_name, q.goal, q.observation) for q in queries])
        found = []
        for q in queries:
            entry = (self.served * 7 + len(q.observation)) % 5
            found.append(Experience(f"tip {entry}: " + "go east " * entry, entry, self.served))
            self.served += 1
        return found


class RecordingStore:
    """Stands for the bank behind Search-and-Ask on rank 0: what it finds depends on every search before
    (as usage penalties do), and it records every search and every exchange."""

    def __init__(self) -> None:
        self.searches: list[tuple[tuple[str, ...], str]] = []
        self.exchanges: list[tuple[str, int | None, str, str, int]] = []

    def retrieve(self, queries, scope, k=1, *, count=True):
        from trainer.store import Entry

        self.searches.append((tuple(queries), scope))
        n = len(self.searches) % 3
        return [[Entry(n, scope, f"entry {n}", "go east " * (n + 1))] for _ in queries]

    def record_ask(self, query, scope, entry, refinement, *, episode_id="", step=0):
        self.exchanges.append((query, entry.id if entry else None, refinement.text, episode_id, step))
        return len(self.exchanges)


class Traces:
    def __init__(self) -> None:
        self.traces: list[dict] = []

    def on_trace(self, step, trace) -> None:
        self.traces.append(dict(trace, step=step))


class Asking:
    """Search-and-Ask as the loop passes it, with every guided episode's completions turned into questions
    that differ by room and turn (a random tiny model never writes the tag): the tool's own rules (guided,
    experienced, the per-episode limit) still decide which are asks."""

    collective = True

    def __init__(self, tool) -> None:
        self.tool = tool

    def __call__(self, states, texts):
        asked = [
            f"<search>way out of room {s.spec.seed} after {len(s.turns)} turns</search>"
            if s.spec.guided
            else t
            for s, t in zip(states, texts, strict=True)
        ]
        return self.tool(states, asked)

    def offer(self, state):
        return self.tool.offer(state)


def run_retrieval(model_path: str) -> dict:
    """Two batches through ``ShardedRunner`` with a retriever on rank 0 alone (a helper rank passes
    ``RankZeroBank``, which raises if called): a training step's 4 guided + 4 free episodes, whose guided
    episodes ask the bank (Search-and-Ask: rank 0's store searches and records, each rank's πϕ engine,
    greedy, refines), then 2 guided evaluation episodes (on 4 ranks, two ranks hold none of them and join
    the retrieval empty-handed)."""
    from trainer.coevolution import RankZeroBank, SearchAndAsk
    from trainer.config import get_preset
    from trainer.extractor.model import Extractor
    from trainer.loop import sample_tasks
    from trainer.models import load_tokenizer
    from trainer.rollout.hf import HFEngine
    from trainer.rollout.runner import EpisodeRunner, ShardedRunner

    class Played(EpisodeRunner):
        """Records the specs this rank played itself."""

        played: list = []

        def run(self, specs, **options):
            self.played += list(specs)
            return super().run(specs, **options)

    cfg = get_preset("cpu").with_overrides(tasks_per_step=2, k_rollouts=4, env="MiniHack-Room-Random-5x5")
    cfg = cfg.with_overrides(method="complementary")  # the random room: each instance asks its own query
    engine = HFEngine(model_path)
    tokenizer = load_tokenizer(model_path)
    main = parallel.is_main()
    bank, store, traces = (
        (RecordingBank(), RecordingStore(), Traces()) if main else (RankZeroBank(), None, None)
    )
    extractor = Extractor(engine, tokenizer, max_new_tokens=8, temperature=0.0)
    tool = SearchAndAsk(store, extractor, cfg, traces)
    tool.step = 1
    inner = Played(engine, tokenizer, max_new_tokens=12, turn_limit=3)
    runner = ShardedRunner(inner)
    step = sample_tasks(cfg, step=1)
    batches = [step, [EpisodeSpec(step[0].env_name, s, s, True, 100 + s) for s in range(2)]]
    episodes = runner.run(batches[0], retrieve=bank, intercept=Asking(tool))[0]
    episodes += runner.run(batches[1], retrieve=bank)[0]  # evaluation: no Search-and-Ask
    runner.close()
    engine.close()
    played = parallel.gather_values(inner.played)
    return {
        "specs": [e.spec for e in episodes],
        "experiences": [e.experience for e in episodes],
        "systems": [e.system for e in episodes],
        "actions": [[t.action_text for t in e.turns] for e in episodes],
        "observations": [[t.observation for t in e.turns] for e in episodes],
        "intercepted": [[t.intercepted for t in e.turns] for e in episodes],
        "ids": [[s.response_ids for s in e.segments] for e in episodes],
        "calls": bank.calls if isinstance(bank, RecordingBank) else None,
        "searches": store.searches if store else None,
        "exchanges": store.exchanges if store else None,
        "traces": traces.traces if traces else None,
        "refinements": {ep: len(g) for ep, g in tool.refinements.items()},
        "played": played,
    }


def run_serve_error() -> dict:
    """Rank 0's server fails while every rank waits for its answers: each rank's error, by rank."""

    def serve(items):
        raise KeyError(f"no entry for {items}")

    try:
        parallel.on_rank_zero([parallel.rank()], [0, 1], serve)
        error = "none"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"errors": parallel.gather_values(error)}


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    placement = parallel.init_distributed("cpu")
    if mode == "retrieval":
        result = run_retrieval(sys.argv[3])
    elif mode == "serve_error":
        result = run_serve_error()
    else:
        result = run_steps(placement, out) if mode == "steps" else run_resume(placement, out)
    if placement.rank == 0:
        torch.save(result, out / f"{mode}-{placement.world_size}.pt")
    # every rank leaves the group together: a rank tearing gloo down while rank 0 still writes its result
    # aborted once ("terminate called without an active exception", SIGABRT) in a full suite run
    parallel.barrier()
    parallel.destroy()


if __name__ == "__main__":
    main()
