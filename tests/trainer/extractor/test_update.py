"""πϕ's CISPO update (``ExtractorUpdate``) on a tiny random Llama: what it trains and when it refuses to."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.trainer.dist_worker import _Prompts, extractor_batch, tiny_llama
from trainer.config import ExtractorConfig
from trainer.extractor.model import StaleExtractorError
from trainer.extractor.update import ExtractorUpdate

CFG = ExtractorConfig(lr=1e-3, micro_batch_size=2, gradient_checkpointing=False)


def _weights(model) -> dict[str, torch.Tensor]:
    return copy.deepcopy(model.state_dict())


def _unchanged(model, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(p, before[n]) for n, p in model.state_dict().items())


def test_a_buffer_without_signal_takes_no_step_but_counts_its_tokens():
    model = tiny_llama(1)
    batch = extractor_batch(model)
    flat = dataclasses.replace(batch, advantages=torch.zeros_like(batch.advantages))
    before = _weights(model)
    metrics = ExtractorUpdate(model, CFG).step(flat, _Prompts())  # type: ignore[arg-type]
    assert _unchanged(model, before)
    assert metrics["extractor/trained_samples"] == 0.0 and metrics["extractor/loss"] == 0.0
    assert metrics["extractor/tokens"] == sum(len(r.generation.token_ids) for r in batch.records)
    assert metrics["extractor/nonfinite_grad_steps"] == 0.0


def test_an_engine_serving_other_weights_fails_loudly_before_the_weights_change():
    model = tiny_llama(1)
    batch = extractor_batch(model)
    stale = [
        dataclasses.replace(
            r, generation=dataclasses.replace(r.generation, logprobs=(-8.0,) * len(r.generation.logprobs))
        )
        for r in batch.records
    ]
    before = _weights(model)
    with pytest.raises(StaleExtractorError, match="not serving the extractor's weights"):
        ExtractorUpdate(model, CFG).step(dataclasses.replace(batch, records=stale), _Prompts())  # type: ignore[arg-type]
    assert _unchanged(model, before)
