"""The episode runner with the real SmolLM2 model on the real vLLM engine (one engine for this module)."""

from __future__ import annotations

import re

import pytest

from trainer.cancel import Cancelled, CancelToken
from trainer.envs import make_env
from trainer.models import default_model_path, load_tokenizer, prepare_default_models
from trainer.prompts import (
    OMITTED_NOTE,
    ChatBuilder,
    ContextOverflow,
    answer_prefix,
    system_prompt,
    user_message,
)
from trainer.rollout import make_engine
from trainer.rollout.runner import EpisodeRunner, EpisodeSpec, Experience, RetrievalQuery

ENV = "MiniHack-Room-5x5"
EXPERIENCE = "Tip 7431: walk diagonally towards the staircase first."
MAX_NEW = 6
CONTEXT = 450
TURN_LIMIT = 4


@pytest.fixture(scope="module")
def tokenizer():
    prepare_default_models(default_model_path())
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def engine():
    engine = make_engine("vllm", default_model_path(), dtype="bfloat16", max_model_len=2048, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def rollout(engine, tokenizer):
    """Two guided and two free episodes, sampled, with a turn limit and a small context budget."""
    queries: list[RetrievalQuery] = []

    def retrieve(batch):
        queries.extend(batch)
        return [Experience(EXPERIENCE, entry_id=7431) for _ in batch]

    runner = EpisodeRunner(
        engine,
        tokenizer,
        max_new_tokens=MAX_NEW,
        turn_limit=TURN_LIMIT,
        context_tokens=CONTEXT,
        temperature=1.0,
    )
    specs = [EpisodeSpec(ENV, seed=3, group=0, guided=k < 2, sample_seed=100 * k) for k in range(4)]
    episodes, stats = runner.run(specs, retrieve=retrieve)
    runner.close()
    return episodes, stats, queries


def _runs_of_ones(mask: list[int], ids: list[int]) -> list[list[int]]:
    runs, current = [], []
    for m, t in zip(mask, ids, strict=True):
        if m:
            current.append(t)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_masks_cover_exactly_the_generated_tokens(rollout, tokenizer):
    episodes, stats, _ = rollout
    assert stats.generated_tokens == sum(e.num_generated for e in episodes)
    for e in episodes:
        runs = [run for seg in e.segments for run in _runs_of_ones(seg.mask, seg.response_ids)]
        # one run of trained ids per turn, and it decodes to exactly what the env was given
        assert [tokenizer.decode(r, skip_special_tokens=True) for r in runs] == [
            t.action_text for t in e.turns
        ]
        assert [len(r) for r in runs] == [t.num_tokens for t in e.turns]
        for seg in e.segments:
            assert len(seg.mask) == len(seg.response_ids) == len(seg.engine_logprobs)
            assert all(lp <= 0 for lp in seg.engine_logprobs)
            assert all(lp == 0.0 for lp, m in zip(seg.engine_logprobs, seg.mask, strict=True) if not m)


def test_the_first_segment_is_the_chat_template_of_the_episode(rollout, tokenizer):
    episodes, _, _ = rollout
    env = make_env(ENV)
    for e in episodes:
        seg = e.segments[0]
        runs = _runs_of_ones(seg.mask, seg.response_ids)
        messages = [{"role": "system", "content": e.system}]
        for turn, run in zip(e.turns, runs, strict=False):  # turns of the first segment
            action = tokenizer.decode(run[:-1] if run[-1] == tokenizer.eos_token_id else run)
            messages += [
                {"role": "user", "content": user_message(turn.observation, env)},
                {"role": "assistant", "content": answer_prefix(env) + action},
            ]
        expected = tokenizer.apply_chat_template(messages, tokenize=False)
        decoded = tokenizer.decode(seg.prompt_ids + seg.response_ids)
        assert expected.startswith(decoded.removesuffix(tokenizer.eos_token))
        assert len(expected) - len(decoded) <= len(tokenizer.eos_token + "\n")


def test_the_turn_limit_ends_episodes(rollout):
    episodes, _, _ = rollout
    for e in episodes:
        assert 1 <= e.num_actions <= TURN_LIMIT
        assert e.success or (e.truncated and e.num_actions == TURN_LIMIT) or e.turns[-1].done


def test_the_runner_reports_the_turn_its_episodes_reached_of_their_limit(engine, tokenizer):
    runner = EpisodeRunner(engine, tokenizer, max_new_tokens=MAX_NEW, turn_limit=3, context_tokens=CONTEXT)
    seen: list[tuple[int, ...]] = []
    specs = [EpisodeSpec(ENV, seed=3, group=0, sample_seed=k) for k in range(2)]
    runner.run(specs, progress=lambda *args: seen.append(args))
    runner.close()
    assert [turn for _, _, turn, _ in seen] == list(range(1, len(seen) + 1)) and len(seen) <= 3
    assert {(total, turns) for _, total, _, turns in seen} == {(2, 3)} and seen[-1][0] == 2


def test_contexts_stay_within_the_token_budget_by_starting_new_segments(rollout, tokenizer):
    episodes, _, _ = rollout
    for e in episodes:
        for seg in e.segments:
            # every prompt fits CONTEXT - MAX_NEW, so prompt + completion never outgrows the context
            assert len(seg.prompt_ids) <= CONTEXT - MAX_NEW
            assert seg.num_ids <= CONTEXT
    long = [e for e in episodes if e.num_actions >= 3]
    assert long, "no episode ran long enough to outgrow the budget"
    for e in long:
        assert len(e.segments) >= 2
        note = OMITTED_NOTE.split("(")[1].split(".")[0]
        assert note in tokenizer.decode(e.segments[1].prompt_ids)


def test_guided_episodes_carry_the_injected_experience_masked_out(rollout, tokenizer):
    episodes, _, queries = rollout
    assert len(queries) == 2
    assert all(q.text.startswith(f"goal: {q.goal}, observation: ") and "@" in q.observation for q in queries)
    for e in episodes:
        prompt = tokenizer.decode(e.segments[0].prompt_ids)
        assert (EXPERIENCE in prompt) == e.spec.guided
        assert (e.experience is not None) == e.spec.guided
        for seg in e.segments:  # never among the trained ids
            assert EXPERIENCE not in tokenizer.decode(
                [t for t, m in zip(seg.response_ids, seg.mask, strict=True) if m]
            )
    assert episodes[0].experience.entry_id == 7431


def test_every_action_records_the_engine_weight_version(rollout, engine):
    episodes, _, _ = rollout
    assert all(e.weight_versions == [engine.weight_version] for e in episodes)


def test_a_rebuilt_prompt_keeps_the_latest_turns_that_fit(tokenizer):
    chat = ChatBuilder(tokenizer)
    env = make_env(ENV)
    system = system_prompt(env)
    history = [(f"observation number {i} " + "x " * 40, f"east {i}") for i in range(10)]
    ids, kept = chat.rebuild(system, history, "the latest observation", budget=400, goal="Reach >.")
    text = tokenizer.decode(ids)
    assert len(ids) <= 400 and 0 < kept < 10
    assert "the latest observation" in text and "east 9" in text and "east 0" not in text
    assert "Goal: Reach >." in text
    with pytest.raises(ContextOverflow):
        chat.rebuild(system, history, "the latest observation", budget=20)


def test_an_observation_turn_does_not_repeat_the_generated_end_of_turn(tokenizer):
    chat = ChatBuilder(tokenizer)
    stopped = chat.observation_turn("obs", [10, tokenizer.eos_token_id])
    cut = chat.observation_turn("obs", [10, 11])
    assert cut == [tokenizer.eos_token_id] + stopped
    assert tokenizer.decode(stopped).startswith("\n<|im_start|>user\nobs")


def test_a_set_cancel_token_stops_the_rollout_before_its_next_turn(engine, tokenizer):
    cancel = CancelToken()
    limits = dict(max_new_tokens=MAX_NEW, turn_limit=TURN_LIMIT, context_tokens=CONTEXT)
    runner = EpisodeRunner(engine, tokenizer, cancel=cancel, **limits)

    def retrieve(batch):
        cancel.set()  # asked while the batch is being set up: no turn may run after it
        return [None for _ in batch]

    specs = [EpisodeSpec(ENV, seed=3, group=0, guided=True, sample_seed=k) for k in range(2)]
    with pytest.raises(Cancelled):
        runner.run(specs, retrieve=retrieve)
    assert sum(len(pool) for pool in runner._pool.values()) == 2  # its environments were given back
    runner.close()


def test_turn_placement_puts_the_experience_after_every_observation_not_in_the_system_prompt(
    engine, tokenizer
):
    runner = EpisodeRunner(
        engine, tokenizer, max_new_tokens=MAX_NEW, turn_limit=3, experience_placement="turn", temperature=1.0
    )
    specs = [EpisodeSpec(ENV, seed=3, group=0, guided=k == 0, sample_seed=k) for k in range(2)]
    try:
        guided, free = runner.run(specs, retrieve=lambda batch: [Experience(EXPERIENCE)] * len(batch))[0]
    finally:
        runner.close()
    text = tokenizer.decode(guided.segments[0].prompt_ids + guided.segments[0].response_ids)
    system = text.split("<|im_start|>user")[0]
    assert EXPERIENCE not in system
    # the first observation and every one after an action but the last (which ends the episode unseen)
    assert text.count(EXPERIENCE) == len(guided.turns) >= 2
    free_text = tokenizer.decode(free.segments[0].prompt_ids + free.segments[0].response_ids)
    assert EXPERIENCE not in free_text
    with pytest.raises(ValueError, match="experience_placement must be one of"):
        EpisodeRunner(engine, tokenizer, experience_placement="footer")


class _Offering:
    """An intercept that answers no completion and offers ``Offer <turns played>`` after odd turns."""

    collective = False

    def __call__(self, states, texts):
        return [None] * len(states)

    def offer(self, state):
        return f"Offer {len(state.turns)}." if len(state.turns) % 2 else None


def test_an_offer_goes_next_to_its_own_observation_and_stays_there_when_the_prompt_is_rebuilt(
    engine, tokenizer
):
    runner = EpisodeRunner(
        engine, tokenizer, max_new_tokens=MAX_NEW, turn_limit=6, context_tokens=CONTEXT, temperature=1.0
    )
    specs = [EpisodeSpec(ENV, seed=3, group=0, sample_seed=k) for k in range(2)]
    try:
        episodes = runner.run(specs, intercept=_Offering())[0]
    finally:
        runner.close()
    long = [e for e in episodes if e.num_actions >= 4 and len(e.segments) >= 2]
    assert long, "no episode ran long enough to rebuild its prompt"
    for e in episodes:
        for seg in e.segments:
            text = tokenizer.decode(seg.prompt_ids + seg.response_ids)
            shown = [int(n) for n in re.findall(r"Offer (\d+)\.", text)]
            assert all(n % 2 for n in shown)  # never next to an observation it was not made for
            assert shown == sorted(set(shown))  # once each, in order
            observations = text.split("<|im_start|>user")[1:]
            for piece in observations:  # each offer right after its observation, before the answer
                if "Offer" in piece:
                    assert piece.index("Offer") > piece.index("Answer with")
        first = tokenizer.decode(e.segments[0].prompt_ids + e.segments[0].response_ids)
        assert "Offer 1." in first or e.num_actions < 2
    rebuilt = tokenizer.decode(long[0].segments[1].prompt_ids)
    assert re.findall(r"Offer (\d+)\.", rebuilt)  # a rebuilt prompt shows the offers as they were made
