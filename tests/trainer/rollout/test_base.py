"""The engine interface: request validation, the backend registry, and the log-prob recompute."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.models import ModelNotFound, default_model_path, load_causal_lm, load_tokenizer
from trainer.rollout import EngineError, GenerationRequest, engine_class, make_engine, sequence_logprobs
from trainer.rollout.base import native_bf16, resolve_dtype


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_ids": ()}, "at least one prompt token"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_new_tokens": -1}, "min_new_tokens"),
        ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens"),
    ],
)
def test_it_refuses_a_request_with_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationRequest(**({"prompt_ids": (1, 2)} | kwargs))


def test_a_request_normalises_its_token_lists_to_tuples_of_int():
    request = GenerationRequest([1, 2, 3], stop_token_ids=[7])
    assert request.prompt_ids == (1, 2, 3) and request.stop_token_ids == (7,)
    assert hash(request) == hash(GenerationRequest((1, 2, 3), stop_token_ids=(7,)))


def test_the_registry_names_both_backends_and_refuses_others(tmp_path):
    assert engine_class("hf").name == "hf"
    with pytest.raises(EngineError, match="unknown rollout engine 'sglang'; choose one of hf, vllm"):
        make_engine("sglang", tmp_path)


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_each_engine_says_when_the_model_folder_is_missing(name, tmp_path):
    with pytest.raises(ModelNotFound, match=f"{name} engine: no model checkpoint"):
        make_engine(name, tmp_path / "nothing-here")


def test_sequence_logprobs_match_one_sequence_at_a_time_despite_padding(model_path):
    model = load_causal_lm(model_path)
    prompts = [[1, 9690, 198, 2683], [1, 4093], [1, 520, 9531, 198, 30, 31, 32]]
    completions = [[359, 253, 5356, 2], [6004, 2, 198, 1, 4093, 7, 8, 9], [11]]
    with torch.no_grad():
        batched = sequence_logprobs(model, prompts, completions, batch_size=2)
        for prompt, completion, got in zip(prompts, completions, batched, strict=True):
            ids = torch.tensor([prompt + completion])
            logp = model(input_ids=ids).logits[0].log_softmax(-1)  # (T, V)
            want = torch.stack([logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(completion)])
            assert got.shape == (len(completion),)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_sequence_logprobs_score_only_the_masked_tokens(model_path):
    model = load_causal_lm(model_path)
    prompts, completions = [[1, 9690, 198], [1, 4093]], [[359, 253, 5356, 2], [6004, 2, 198]]
    masks = [[0, 1, 0, 1], [0, 0, 0]]
    with torch.no_grad():
        full = sequence_logprobs(model, prompts, completions)
        some = sequence_logprobs(model, prompts, completions, masks=masks)
    for f, s, m in zip(full, some, masks, strict=True):
        m = torch.tensor(m, dtype=torch.bool)
        torch.testing.assert_close(s[m], f[m], atol=1e-5, rtol=0)
        assert s.shape == f.shape and not s[~m].any()


def test_sequence_logprobs_carry_gradients_for_the_policy_loss(model_path):
    model = load_causal_lm(model_path)
    (logp,) = sequence_logprobs(model, [[1, 4093, 198]], [[6004, 2]])
    logp.sum().backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_the_native_dtype_is_bf16_exactly_where_the_cpu_has_bf16_instructions(monkeypatch):
    """An AVX2-only CPU emulates bf16 (transformers generates 2-4x slower in it than in float32): "native"
    takes float32 there and bf16 on CPUs with AVX512-BF16 or AMX, as /proc/cpuinfo reports them."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flags = set(Path("/proc/cpuinfo").read_text().split())
    hardware_bf16 = bool({"avx512_bf16", "amx_tile"} & flags)
    assert native_bf16() is hardware_bf16
    assert resolve_dtype("native") == ("bfloat16" if hardware_bf16 else "float32")
    assert [resolve_dtype(d) for d in ("float32", "bfloat16", "auto")] == ["float32", "bfloat16", "auto"]
    engine = make_engine("hf", default_model_path(), dtype="native")
    assert engine.model.dtype == getattr(torch, resolve_dtype("native"))


def test_a_missing_model_folder_names_the_command_that_prepares_it_before_any_hub_lookup(tmp_path):
    with pytest.raises(ModelNotFound, match=r"checkpoint in .*nothing-here: run `python manage.py prepare_"):
        load_tokenizer(tmp_path / "nothing-here")
