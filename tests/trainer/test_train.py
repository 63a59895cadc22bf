"""End to end: a 2-step GRPO run on MiniHack with the real SmolLM2 model and the vLLM engine, its
checkpoint, resuming from it, and the command line (one engine for this module).

MiniHack-Room-5x5 always starts in one corner with the stairs in the other (4 moves); an untrained
135M model never gets there in a short test, so every reward is 0 and GRPO rightly does nothing. The
test runs the same room with random placement instead, with a seed whose sampled instances (steps 1-3)
start next to the stairs: rollouts then differ in outcome and the update has a signal.
"""

from __future__ import annotations

import argparse
import io
import json

import pytest
import torch

from tests.trainer.recording import Recorder
from trainer.assemble import build_engine, read_resume_point
from trainer.checkpoint import read_checkpoint
from trainer.config import ConfigError, get_preset
from trainer.evaluate import evaluate_checkpoint
from trainer.models import default_model_path, load_causal_lm, prepare_default_models
from trainer.report import ConsoleReporter, Reporters
from trainer.rollout.base import sequence_logprobs
from trainer.train import config_from_args, main, resumed_step, train

# Small enough for this machine; sampled at 0.7 so that rollouts of one task differ in outcome.
# Seed 112: the instances of steps 1, 2 and 3 are each one move from the stairs.
CFG = get_preset("cpu").with_overrides(
    **{
        "method": "grpo",
        "steps": 2,
        "env": "MiniHack-Room-Random-5x5",
        "tasks_per_step": 1,
        "k_rollouts": 6,
        "seed": 112,
        "eval_every": 0,
        "eval_episodes": 2,
        "checkpoint_every": 0,
        "actor.lr": 1e-4,
        "rollout.max_new_tokens": 4,
        "rollout.turn_limit": 2,
        "rollout.temperature": 0.7,
        "rollout.context_tokens": 1024,
    }
)


@pytest.fixture(scope="module")
def engine():
    prepare_default_models(default_model_path())
    engine = build_engine(CFG)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def first_run(engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    recorder = Recorder()
    log = io.StringIO()
    metrics, loop = train(CFG, out_dir=out, engine=engine, reporter=Reporters(recorder, ConsoleReporter(log)))
    return out, recorder, loop, log.getvalue()


def test_two_steps_change_the_actor_and_sync_it_to_the_engine(first_run, engine):
    out, recorder, loop, log = first_run
    assert sorted(recorder.steps) == [1, 2]
    # some task instance had mixed outcomes, so there was a learning signal
    assert any(m["adv/zero_groups_frac"] < 1 for m in recorder.steps.values())
    initial = load_causal_lm(CFG.actor.model_path)
    changed = [
        name
        for (name, p), q in zip(loop.model.named_parameters(), initial.parameters(), strict=True)
        if not torch.equal(p, q)
    ]
    assert changed
    # the engine serves the trained weights: its log-probs match the trainer's, not the initial model's
    assert engine.weight_version == 2
    seg = recorder.batches[2][0].segments[0]
    prompt, completion = seg.prompt_ids, seg.response_ids[:8]
    (served,) = engine.score([prompt], [completion])
    with torch.no_grad():
        (trained,) = sequence_logprobs(loop.model, [prompt], [completion])
    # bf16 engine: typical tokens agree to ~0.01; a rare unlikely token can be off by ~1
    assert (torch.tensor(served) - trained).abs().median() < 0.05
    # every action of step 2 came from the weights synced after step 1
    assert all(e.weight_versions == [1] for e in recorder.batches[2])


def test_the_run_reports_evaluation_and_timings(first_run):
    out, recorder, loop, log = first_run
    assert sorted(recorder.evals) == [0, 2]  # the untrained model, then the end
    assert recorder.evals[0]["eval/episodes"] == 2
    # each evaluation's episodes reach the reporter just before its figures: grpo's one column, greedy
    for step in (0, 2):
        assert recorder.events.index(("eval episodes", step)) + 1 == recorder.events.index(("eval", step))
        episodes = recorder.eval_batches[step]
        assert [(e.spec.seed, e.spec.guided, e.experience) for e in episodes] == [
            (0, False, None),
            (1, False, None),
        ]
        assert recorder.evals[step]["eval/success"] == sum(e.success for e in episodes) / 2
    for m in recorder.steps.values():
        for key in (
            "time/rollout_s",
            "time/recompute_s",
            "time/backward_s",
            "time/sync_s",
            "rollout/tokens_per_s",
        ):
            assert m[key] > 0
        assert 0 <= m["train/success"] <= 1 and m["train/episodes"] == 6
        assert 0.3 < m["memory/rss_gib"] < 24  # the process's resident size after the step, models included
    assert "step 2/2" in log and "rollout" in log and "eval after step 2" in log
    assert not (out / "metrics.jsonl").exists()  # the caller's reporter replaces the default ones


def test_every_long_phase_reports_its_progress_before_the_step_or_evaluation_ends(first_run):
    out, recorder, loop, log = first_run
    events = recorder.events
    evaluation = [e for e in events[: events.index(("eval", 0))] if e[0] == "progress"]
    assert evaluation[0][2:] == ("evaluation", 0, 0) and evaluation[-1][2:] == ("evaluation", 2, 2)
    step_1 = events[events.index(("eval", 0)) + 1 : events.index(("step", 1))]
    phases = [e[2] for e in step_1]
    assert phases[0] == "rollouts" and ("progress", 1, "rollouts", 6, 6) in step_1
    assert "actor update" in phases and phases[-1] == "weight sync"
    update = [e for e in step_1 if e[2] == "actor update" and e[3]]
    assert update and update[-1][3] == update[-1][4]  # every micro-batch done before the step's row


def test_a_checkpoint_resumes_at_the_next_step_with_the_same_config(first_run, engine, tmp_path):
    out, recorder, loop, _ = first_run
    state = read_checkpoint(out)
    assert state.step == 2 and state.engine_version == 2 and state.config == CFG
    assert (state.path / "actor" / "config.json").exists() and (state.path / "optimizer.pt").exists()

    resumed = Recorder()
    _, loop2 = train(CFG.with_overrides(steps=3), out_dir=out, resume=out, engine=engine, reporter=resumed)
    assert sorted(resumed.steps) == [3]
    assert sorted(resumed.evals) == [3]
    assert read_checkpoint(out).step == 3
    assert engine.weight_version > 2
    # it started from the checkpoint's weights, not the initial model's
    assert resumed.steps[3]["actor/engine_logp_diff"] < 0.1


def test_a_checkpoint_evaluates_on_its_own_vllm_engine(first_run):
    out, _, _, _ = first_run
    metrics = evaluate_checkpoint(out / "checkpoints" / "step-000002", engine_name="vllm")
    assert metrics["eval/checkpoint_step"] == 2 and metrics["eval/episodes"] == CFG.eval_episodes
    assert 0 <= metrics["eval/success"] <= 1 and 1 <= metrics["eval/actions"] <= CFG.rollout.turn_limit


def test_a_resumed_run_records_the_step_its_checkpoint_holds(first_run):
    out = first_run[0]  # an earlier test may have resumed it one step further
    assert resumed_step(argparse.Namespace(resume=str(out))) == read_checkpoint(out).step >= 2
    assert resumed_step(argparse.Namespace(resume=None)) == 0


def test_resuming_with_a_different_config_is_refused(first_run, engine):
    out, _, _, _ = first_run
    with pytest.raises(ConfigError, match=r"actor\.lr: 0\.0001 in the checkpoint, 0\.001 now"):
        train(CFG.with_overrides(**{"actor.lr": 1e-3}), out_dir=out, resume=out, engine=engine)


def test_a_checkpoint_saved_before_a_setting_existed_resumes_and_says_what_it_takes(tmp_path, capsys):
    saved = CFG.to_dict()
    del saved["extractor"]["temperature"]  # as written by a version without the setting
    folder = tmp_path / "checkpoints" / "step-000002"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"step": 2, "engine_version": 2, "config": saved}))
    state = read_resume_point(CFG.with_overrides(steps=3), tmp_path, tmp_path)
    assert state.step == 2 and state.new_settings == {"extractor.temperature": 1.0}
    assert "predates extractor.temperature = 1.0" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"extractor\.temperature: 1\.0 in the checkpoint, 0\.5 now"):
        read_resume_point(CFG.with_overrides(steps=3, **{"extractor.temperature": 0.5}), tmp_path, tmp_path)


def test_a_reporter_can_stop_the_run_and_it_is_checkpointed(engine, tmp_path):
    recorder = Recorder(stop_after=1)
    _, loop = train(CFG.with_overrides(steps=5), out_dir=tmp_path, engine=engine, reporter=recorder)
    assert sorted(recorder.steps) == [1]
    assert read_checkpoint(tmp_path).step == 1


def test_the_command_line_builds_the_config_from_preset_flags_and_overrides(tmp_path):
    import argparse

    from trainer.train import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--config", "cpu", "--env", "MiniHack-Room-Dark-5x5", "--method", "grpo", "--steps", "7"]
        + ["--set", "actor.lr=3e-5", "--set", "rollout.turn_limit=5"]
    )
    cfg = config_from_args(args)
    assert (cfg.env, cfg.method, cfg.steps, cfg.actor.lr, cfg.rollout.turn_limit) == (
        "MiniHack-Room-Dark-5x5",
        "grpo",
        7,
        3e-5,
        5,
    )
    assert main(["--method", "complementary", "--steps", "1", "--out", str(tmp_path)]) == 2
    assert main(["--set", "actor.lr", "--out", str(tmp_path)]) == 2
