"""bf16 vLLM engines on CPUs without hardware bf16: their linear layers multiply in float32.

oneDNN's bf16 GEMM is emulated on AVX2-only CPUs, and slow; the route takes bf16 inputs and weights to a
float32 GEMM and rounds the result to bf16, as AVX512-BF16 / AMX hardware does. Pinned here: per GEMM it
gives torch's own bf16 result, and an engine on it serves bf16 numbers and follows weight updates.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import vllm.model_executor.layers.utils as layer_utils

from trainer.models import load_causal_lm
from trainer.rollout import GenerationRequest, make_engine, sequence_logprobs
from trainer.rollout import vllm as vllm_engine

ENGINE_OPTIONS = {"max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20, "warmup": False}


@pytest.fixture
def routed_layers(monkeypatch):
    """The float32 route installed for this test (on any hardware), vLLM's dispatch restored after it;
    the list collects the float32 weight copy of every layer the route takes over."""
    current = layer_utils.dispatch_cpu_unquantized_gemm
    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", current)
    vllm_engine._route_bf16_gemms_through_float32()
    taken: list[torch.Tensor] = []
    make_linear = vllm_engine._float32_linear

    def spy(weight32):
        taken.append(weight32)
        return make_linear(weight32)

    monkeypatch.setattr(vllm_engine, "_float32_linear", spy)
    return taken


@pytest.fixture
def requests(chat):
    return [GenerationRequest(chat(q), max_new_tokens=16, temperature=0.0) for q in ("Hi!", "2+2?")]


def test_per_gemm_it_gives_torchs_bf16_result_up_to_the_order_of_the_sums():
    torch.manual_seed(0)
    x = torch.randn(64, 576).bfloat16()
    weight, bias = (torch.randn(1536, 576) * 0.05).bfloat16(), torch.randn(1536).bfloat16()
    got = vllm_engine._float32_linear(weight.float())(x, None, bias)
    want = F.linear(x, weight, bias)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    differs = got != want
    assert differs.float().mean() < 1e-3  # a few elements apart, the rest identical
    # and those by bf16 rounding at the scale of the sum's terms (a near-cancelling sum can be tiny)
    scale = F.linear(x.float().abs(), weight.float().abs(), bias.float().abs())
    assert ((got.float() - want.float()).abs() <= scale * 2.0**-8).all()


def test_an_engine_on_the_route_serves_bf16_numbers(model_path, requests, routed_layers):
    with make_engine("vllm", model_path, dtype="bfloat16", **ENGINE_OPTIONS) as engine:
        generations = engine.generate(requests)
    assert len(routed_layers) > 30  # every projection of every block, and the output layer
    with torch.no_grad():
        want = sequence_logprobs(
            load_causal_lm(model_path), [r.prompt_ids for r in requests], [g.token_ids for g in generations]
        )
    gaps = torch.cat([torch.tensor(g.logprobs) - w for g, w in zip(generations, want, strict=True)]).abs()
    assert 1e-3 < gaps.mean() < 0.1  # bf16 rounding, not float32 (~1e-4) and not a broken model


def test_after_an_update_the_route_serves_the_new_weights(model_path, requests, routed_layers):
    prompts = [list(r.prompt_ids) for r in requests]
    trainer_model = load_causal_lm(model_path)
    with make_engine("vllm", model_path, dtype="bfloat16", **ENGINE_OPTIONS) as engine:
        completions = [g.token_ids for g in engine.generate(requests)]
        optimizer = torch.optim.AdamW(trainer_model.parameters(), lr=1e-3)
        (-torch.cat(sequence_logprobs(trainer_model, prompts, completions)).mean()).backward()
        optimizer.step()
        with torch.no_grad():
            want = torch.cat(sequence_logprobs(trainer_model, prompts, completions))
        before = torch.tensor(sum(engine.score(prompts, completions), []))
        loaded = len(routed_layers)
        engine.update_weights(trainer_model.state_dict(), version=1)
        after = torch.tensor(sum(engine.score(prompts, completions), []))
    assert len(routed_layers) == 2 * loaded  # each layer's float32 copy taken again from the new weights
    assert (after - want).abs().mean() < (before - want).abs().mean() / 4
