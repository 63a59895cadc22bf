"""A complementary run end to end: real SmolLM2 actor and extractor on vLLM, MiniHack-Room-5x5, the real
experience bank (PostgreSQL + pgvector through ExperienceManager), a tiny config (warm-up 1, merge every
step, a buffer of 2) so that every part of the dual loop happens within a few steps.

A 135M actor does not discover the Search-and-Ask tool by itself, so ``AsksFirst`` makes the actor's first
turn of the first guided episodes a tool call, scored by the real engine (its log-probs are the model's
own); everything after it (the runner pausing the episode, retrieval, the extractor's refinement, the
masked observation, the trace and the credit) is the code under test.
"""

from __future__ import annotations

import pytest
import torch

from experience.manager import ExperienceManager
from experience.models import Experience, Merge, SearchAsk
from trainer.coevolution import train
from trainer.config import get_preset
from trainer.models import default_model_path, load_causal_lm, load_tokenizer, prepare_default_models
from trainer.report import BaseReporter
from trainer.rollout.base import Generation
from trainer.rollout.vllm import VLLMEngine
from webapp.models import Run

QUESTION = "<search>how do I reach the stairs?</search>"


class AsksFirst:
    """The actor's engine, except that the first turn of up to ``times`` guided episodes asks the bank."""

    def __init__(self, engine, tokenizer, times: int = 2) -> None:
        self.inner, self.tokenizer, self.left = engine, tokenizer, times
        self.ids = tokenizer(" " + QUESTION, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def generate(self, requests):
        out = self.inner.generate(requests)
        for i, r in enumerate(requests):
            prompt = self.tokenizer.decode(r.prompt_ids)
            if self.left and "<search>" in prompt and prompt.count("<|im_start|>assistant") == 1:
                self.left -= 1
                (logprobs,) = self.inner.score([r.prompt_ids], [self.ids])
                out[i] = Generation(list(self.ids), logprobs, "stop", QUESTION, self.inner.weight_version)
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Recorder(BaseReporter):
    def __init__(self) -> None:
        self.steps, self.evals, self.traces = [], [], []

    def on_step(self, step, metrics):
        self.steps.append((step, dict(metrics)))

    def on_eval(self, step, metrics):
        self.evals.append((step, dict(metrics)))

    def on_trace(self, step, trace):
        self.traces.append((step, dict(trace)))


def changed(model: torch.nn.Module, reference: torch.nn.Module) -> bool:
    name = "model.layers.0.self_attn.q_proj.weight"
    return not torch.equal(dict(model.named_parameters())[name], dict(reference.named_parameters())[name])


@pytest.mark.timeout(600)
@pytest.mark.django_db(transaction=True)
def test_a_complementary_run_distils_merges_asks_and_trains_both_models(embedded_services, user, tmp_path):
    path = prepare_default_models(default_model_path())
    cfg = get_preset("cpu").with_overrides(
        **{
            "method": "complementary",
            "steps": 3,
            "tasks_per_step": 1,
            "k_rollouts": 4,
            "eval_every": 0,
            "eval_episodes": 1,
            "checkpoint_every": 0,
            "actor.model_path": str(path),
            "extractor.model_path": str(path),
            "extractor.buffer_size": 2,
            "extractor.max_new_tokens": 64,
            "experience.warmup_steps": 1,
            "experience.merge_every": 1,
            "rollout.max_new_tokens": 8,
            "rollout.turn_limit": 4,
            "rollout.context_tokens": 1024,
            "rollout.kv_cache_gib": 0.25,
        }
    )
    run = Run.objects.create(name="coevolution test", owner=user, method=cfg.method, config=cfg.to_dict())
    reporter = Recorder()
    options = dict(dtype=cfg.rollout.dtype, max_model_len=1024, kv_cache_memory_bytes=1 << 28)
    actor_engine = VLLMEngine(path, seed=0, **options)
    extractor_engine = VLLMEngine(path, seed=1, **options)
    try:
        with ExperienceManager(run.pk, workers=2) as store:
            metrics, loop = train(
                cfg,
                store=store,
                out_dir=tmp_path,
                reporter=reporter,
                engine=AsksFirst(actor_engine, load_tokenizer(path)),
                extractor_engine=extractor_engine,
            )
            bank = store.size()
    finally:
        extractor_engine.close()
        actor_engine.close()

    print(
        {k: v for k, v in metrics.items() if k.startswith(("extractor/", "experience/", "bank/", "actor/"))}
    )
    # the bank gained entries from distillation, and was merged every step
    assert bank > 0 and Experience.objects.filter(run=run).exists()
    assert metrics["extractor/distil_calls"] == 4 * 3  # every episode, one batched call per step
    assert metrics["extractor/distilled"] == 4 * 3
    assert Merge.objects.filter(run=run).count() >= 1 and metrics["extractor/merges"] == 3
    # Search-and-Ask: the exchange is recorded, traced, and its answer was the episode's next observation
    exchanges = list(SearchAsk.objects.filter(run=run))
    assert exchanges and reporter.traces
    assert any(t["query"] == "how do I reach the stairs?" and t["answer"] for _, t in reporter.traces)
    assert exchanges[0].success is not None  # credited by the episode's outcome
    # the extractor took CISPO steps and its engine serves the new weights
    assert metrics["extractor/updates"] >= 1 and loop.extractor.expected_version >= 1
    assert extractor_engine.weight_version == loop.extractor.expected_version
    # both models took optimiser steps; their parameters moved wherever an advantage was not zero (a tiny
    # run may see only failures, and then GRPO and CISPO rightly leave the weights alone)
    reference = load_causal_lm(path)
    actor_signal = any(m["adv/abs_mean"] > 0 for _, m in reporter.steps)
    assert all("actor/grad_norm" in m for _, m in reporter.steps)
    assert changed(loop.model, reference) == actor_signal
    assert changed(loop.extractor_update.model, reference) == (metrics["extractor/updates_with_signal"] > 0)
    print(
        {
            "actor_signal": actor_signal,
            "extractor_updates_with_signal": metrics["extractor/updates_with_signal"],
        }
    )
    # metrics reach the reporter every step; evaluation reports both columns
    assert [s for s, _ in reporter.steps] == [1, 2, 3]
    assert reporter.steps[0][1]["experience/retrieval_active"] == 0.0
    assert reporter.steps[-1][1]["experience/retrieval_active"] == 1.0
    for _, m in reporter.evals:
        assert {"eval/success", "eval/actions", "eval/with_exp/success", "eval/with_exp/actions"} <= m.keys()
