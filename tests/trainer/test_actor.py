"""The actor update on hand-built episodes with the real SmolLM2 model (no engine needed).

Each episode is one or two segments of a real chat: a prompt, then the actor's action ids (mask 1) and
an observation turn (mask 0). Engine log-probs are the trainer's own, as a synced engine would give.
"""

from __future__ import annotations

import copy

import pytest
import torch

from trainer.actor import ActorUpdate, StaleWeightsError, training_rows
from trainer.config import ActorConfig
from trainer.models import default_model_path, load_causal_lm, load_tokenizer, prepare_default_models
from trainer.prompts import ChatBuilder
from trainer.rollout.base import sequence_logprobs
from trainer.rollout.runner import Episode, EpisodeSpec, Segment


@pytest.fixture(scope="module")
def tokenizer():
    prepare_default_models(default_model_path())
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)
    return load_causal_lm(default_model_path())


def _segment(chat: ChatBuilder, model, observation: str, actions: list[str]) -> Segment:
    seg = Segment(prompt_ids=chat.prompt("Answer with a direction.", observation))
    for i, action in enumerate(actions):
        ids = chat.encode_text(action) + [chat.eos_token_id]
        seg.response_ids += ids
        seg.mask += [1] * len(ids)
        if i < len(actions) - 1:
            obs = chat.observation_turn("You moved. Where now?", ids)
            seg.response_ids += obs
            seg.mask += [0] * len(obs)
    with torch.no_grad():
        (lp,) = sequence_logprobs(model, [seg.prompt_ids], [seg.response_ids])
    seg.engine_logprobs = [x if m else 0.0 for x, m in zip(lp.tolist(), seg.mask, strict=True)]
    return seg


def _episode(segments: list[Segment], reward: float, group: int = 0, guided: bool = False) -> Episode:
    return Episode(
        spec=EpisodeSpec("MiniHack-Room-5x5", seed=group, group=group, guided=guided),
        goal="",
        system="",
        experience=None,
        turns=[],
        segments=segments,
        reward=reward,
        success=reward > 0,
        truncated=False,
        weight_versions=[0],
        wall_s=0.0,
    )


@pytest.fixture(scope="module")
def batch(tokenizer, base_model):
    chat = ChatBuilder(tokenizer)
    obs = "The stairs are 1 east of you."
    return [
        _episode([_segment(chat, base_model, obs, ["east"])], 1.0),
        _episode([_segment(chat, base_model, obs, ["north", "west"])], 0.0),
        # one episode in two segments, as after a context rebuild
        _episode(
            [_segment(chat, base_model, obs, ["south"]), _segment(chat, base_model, "Now where?", ["west"])],
            0.0,
        ),
        _episode([_segment(chat, base_model, obs, ["east", "east"])], 1.0),
    ]


def _update(model, episodes, **cfg) -> tuple[ActorUpdate, dict[str, float]]:
    actor = ActorUpdate(
        model, ActorConfig(lr=1e-4, gradient_checkpointing=False, **cfg), estimator="grpo_split"
    )
    return actor, actor.step(episodes)


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_equal_rewards_leave_every_parameter_exactly_unchanged(base_model, batch):
    model = copy.deepcopy(base_model)
    before = _params(model)
    flat = [_episode(e.segments, 1.0, group=e.spec.group) for e in batch]
    _, metrics = _update(model, flat)
    assert metrics["actor/loss"] == 0.0
    assert metrics["actor/grad_norm"] == 0.0
    assert metrics["adv/zero_groups_frac"] == 1.0
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_an_update_raises_the_logprob_of_successful_actions_and_lowers_failed_ones(base_model, batch):
    model = copy.deepcopy(base_model)
    _, metrics = _update(model, batch)
    # one epoch at the weights that produced old_logp: ratio 1 everywhere, nothing clipped
    assert metrics["actor/clip_frac"] == 0.0
    assert metrics["actor/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/grad_norm"] > 0
    assert metrics["actor/tokens"] == sum(s.num_trained for e in batch for s in e.segments)
    assert metrics["actor/engine_logp_diff"] < 1e-3

    def mean_logp(m, episode):
        seg = episode.segments[0]
        with torch.no_grad():
            (lp,) = sequence_logprobs(m, [seg.prompt_ids], [seg.response_ids])
        mask = torch.tensor(seg.mask, dtype=torch.bool)
        return lp[mask].mean().item()

    assert mean_logp(model, batch[0]) > mean_logp(base_model, batch[0])  # success: up
    assert mean_logp(model, batch[1]) < mean_logp(base_model, batch[1])  # failure: down


def test_micro_batching_gives_the_full_batch_gradient(base_model, batch):
    grads = []
    for mbs in (1, 8):
        model = copy.deepcopy(base_model)
        actor = ActorUpdate(
            model, ActorConfig(micro_batch_size=mbs, gradient_checkpointing=False), estimator="grpo_split"
        )
        actor.optimizer.step = lambda: None  # keep the accumulated gradients to compare them
        actor.optimizer.zero_grad = lambda set_to_none=True: None
        metrics = actor.step(batch)
        grads.append((metrics["actor/loss"], torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss_a, grad_a), (loss_b, grad_b) = grads
    assert loss_a == pytest.approx(loss_b, rel=1e-4, abs=1e-7)
    # float32 sums in a different order: equal up to rounding, relative to the gradient's size
    assert float((grad_a - grad_b).norm() / grad_a.norm()) < 1e-4
    assert float((grad_a - grad_b).abs().max()) < 1e-4 * float(grad_a.abs().max())


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"])
def test_row_weights_make_each_episode_count_as_one_trajectory(batch, agg):
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    group_ids = torch.zeros(4, dtype=torch.long)
    guided = torch.zeros(4, dtype=torch.bool)
    rows = training_rows(batch, adv, group_ids, guided, agg)
    assert len(rows) == 5  # the two-segment episode gives two rows
    per_episode = [0.0] * 4
    for r in rows:
        # a loss of 1 per token: each episode's share of the total loss
        per_episode[r.episode] += r.weight * r.segment.num_trained
    n_tok = [sum(s.num_trained for s in e.segments) for e in batch]
    expected = {
        "seq-mean-token-mean": [0.25] * 4,
        "seq-mean-token-sum": [n / 4 for n in n_tok],
        "token-mean": [n / sum(n_tok) for n in n_tok],
    }[agg]
    assert per_episode == pytest.approx(expected)


def test_guided_and_free_halves_weigh_equally_whatever_their_sizes(batch):
    episodes = [_episode(e.segments, e.reward, guided=i == 0) for i, e in enumerate(batch)]
    adv = torch.zeros(4)
    rows = training_rows(
        episodes,
        adv,
        torch.zeros(4, dtype=torch.long),
        torch.tensor([1, 0, 0, 0]).bool(),
        "seq-mean-token-mean",
    )
    share = [0.0] * 4
    for r in rows:
        share[r.episode] += r.weight * r.segment.num_trained
    assert share[0] == pytest.approx(0.5)  # the lone guided episode is half the objective
    assert sum(share[1:]) == pytest.approx(0.5)


def test_an_engine_serving_other_weights_fails_loudly(base_model, batch):
    stale = [copy.deepcopy(e) for e in batch]
    for e in stale:
        for s in e.segments:
            s.engine_logprobs = [-8.0 if m else 0.0 for m in s.mask]
    with pytest.raises(StaleWeightsError, match="not serving the actor's weights"):
        _update(copy.deepcopy(base_model), stale)


def test_an_update_waits_while_another_trainer_holds_its_pass(base_model, batch):
    """The actor's forward and backward take turns with πϕ's (trainer.memory.ONE_PASS): never both sets of
    activations in memory at once."""
    import threading

    from trainer import memory

    model = copy.deepcopy(base_model)
    done = threading.Event()
    with memory.ONE_PASS:  # πϕ's pass, as on the extractor track's thread
        worker = threading.Thread(target=lambda: (_update(model, batch), done.set()))
        worker.start()
        done.wait(3.0)  # unblocked, a backward of this batch takes ~1 s here
        assert not done.is_set() and all(p.grad is None for p in model.parameters())  # none ran
    worker.join(120)
    assert done.is_set()
