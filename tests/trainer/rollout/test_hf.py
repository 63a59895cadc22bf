"""The transformers engine: batched sampling with per-request settings, raw log-probs, weight updates."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from trainer.models import load_causal_lm
from trainer.rollout import EngineError, GenerationRequest, make_engine, sequence_logprobs


@pytest.fixture(scope="module")
def engine(model_path):
    engine = make_engine("hf", model_path)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def requests(chat):
    return [
        GenerationRequest(chat("What is 2+2?"), max_new_tokens=12, temperature=0.7, seed=1),
        GenerationRequest(chat("Say hello."), max_new_tokens=16, temperature=1.0, top_p=0.9, seed=2),
        GenerationRequest(chat("Name a colour."), max_new_tokens=5, temperature=0.0),
    ]


@pytest.fixture(scope="module")
def generations(engine, requests):
    return engine.generate(requests)


def test_it_samples_a_batch_with_finish_reasons_and_the_stop_token_kept(requests, generations, tokenizer):
    assert len(generations) == 3
    for request, generation in zip(requests, generations, strict=True):
        assert len(generation.token_ids) == len(generation.logprobs) <= request.max_new_tokens
        assert all(lp <= 0 for lp in generation.logprobs)
        assert generation.text == tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        if generation.finish_reason == "length":
            assert len(generation.token_ids) == request.max_new_tokens
        else:
            assert generation.finish_reason == "stop" and generation.token_ids[-1] == tokenizer.eos_token_id
            assert tokenizer.eos_token_id not in generation.token_ids[:-1]
    assert generations[2].finish_reason == "length" and len(generations[2].token_ids) == 5


def test_its_logprobs_are_the_raw_model_logprobs_of_the_sampled_tokens(engine, requests, generations):
    trainer_model = load_causal_lm(engine.model_path)
    with torch.no_grad():
        recomputed = sequence_logprobs(
            trainer_model, [r.prompt_ids for r in requests], [g.token_ids for g in generations]
        )
    for generation, want in zip(generations, recomputed, strict=True):
        torch.testing.assert_close(torch.tensor(generation.logprobs), want, atol=1e-3, rtol=0)


def test_a_stop_token_ends_only_its_own_request(engine, chat):
    greedy = GenerationRequest(chat("Count from one to ten in words."), max_new_tokens=10, temperature=0.0)
    (free,) = engine.generate([greedy])
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    stopped, unaffected = engine.generate([replace(greedy, stop_token_ids=(stop,)), greedy])
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: first + 1]
    assert unaffected.token_ids == free.token_ids and unaffected.finish_reason == "length"


def test_a_repetition_penalty_steers_only_its_own_request_and_logprobs_stay_raw(engine, chat):
    greedy = GenerationRequest(chat("Count from one to ten in words."), max_new_tokens=24, temperature=0.0)
    free, penalised = engine.generate([greedy, replace(greedy, repetition_penalty=3.0)])

    def repeats(tokens):  # tokens already seen in the prompt or earlier in the answer
        return sum(t in greedy.prompt_ids or t in tokens[:i] for i, t in enumerate(tokens))

    assert repeats(free.token_ids) >= 8  # the premise: "one, two, three, ..." repeats its commas
    assert repeats(penalised.token_ids) < repeats(free.token_ids) // 2
    assert engine.generate([greedy])[0].token_ids == free.token_ids  # its neighbour was left alone
    trainer_model = load_causal_lm(engine.model_path)
    with torch.no_grad():
        (raw,) = sequence_logprobs(trainer_model, [greedy.prompt_ids], [penalised.token_ids])
    torch.testing.assert_close(torch.tensor(penalised.logprobs), raw, atol=1e-3, rtol=0)


def test_min_new_tokens_holds_back_the_end_of_its_own_request(engine, check_min_new_tokens):
    check_min_new_tokens(engine)


def test_the_same_seed_gives_the_same_completion_whatever_the_batch(engine, requests, generations):
    first = generations
    again = engine.generate(requests)
    alone = engine.generate([requests[1]])
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert alone[0].token_ids == first[1].token_ids
    other_seed = replace(requests[1], seed=3)
    assert engine.generate([other_seed])[0].token_ids != first[1].token_ids


def test_it_says_structured_output_needs_vllm(engine, chat):
    with pytest.raises(EngineError, match="json_schema.*vllm"):
        engine.generate([GenerationRequest(chat("Hi"), json_schema={"type": "object"})])


def test_updated_weights_are_served_with_their_version(engine, chat):
    prompt, completion = chat("Hi"), [19556, 17, 2]
    before = engine.score([prompt], [completion])[0]
    trainer_model = load_causal_lm(engine.model_path)
    with torch.no_grad():
        trainer_model.model.norm.weight.mul_(1.5)
        want = sequence_logprobs(trainer_model, [prompt], [completion])[0]
    version = engine.weight_version + 1
    engine.update_weights(trainer_model.state_dict(), version=version)
    after = engine.score([prompt], [completion])[0]
    torch.testing.assert_close(torch.tensor(after), want, atol=1e-4, rtol=0)
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 0.1
    assert engine.generate([GenerationRequest(prompt, max_new_tokens=2)])[0].weight_version == version


def test_it_refuses_a_stale_weight_version_and_foreign_weights(engine):
    version = engine.weight_version
    with pytest.raises(EngineError, match=f"weight version {version} is not newer"):
        engine.update_weights({}, version=version)
    with pytest.raises(EngineError, match="do not fit"):
        engine.update_weights({"encoder.weight": torch.zeros(2)}, version=version + 1)
    assert engine.weight_version == version


def test_a_closed_engine_refuses_work(model_path, chat):
    engine = make_engine("hf", model_path, dtype="bfloat16")
    engine.close()
    engine.close()
    with pytest.raises(EngineError, match="closed"):
        engine.generate([GenerationRequest(chat("Hi"))])
