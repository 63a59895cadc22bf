"""A real run killed between two checkpoints and resumed writes its result files with each row once: the rows
of a run that never stopped (the real loop, vLLM engine and MiniHack env; a tiny random-initialised Llama with
SmolLM2's tokenizer as the actor, so checkpoints take no time)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.trainer.tiny_models import tiny_llama_folder
from trainer.assemble import build_engine, file_reporters, train
from trainer.config import get_preset
from trainer.report import BaseReporter, Reporters
from trainer.runfiles import read_lines, repeated_rows

BASE = get_preset("cpu").with_overrides(
    **{
        "method": "grpo",
        "steps": 3,
        "env": "MiniHack-Room-Random-5x5",
        "tasks_per_step": 1,
        "k_rollouts": 2,
        "seed": 112,
        "eval_every": 0,
        "eval_episodes": 2,
        "checkpoint_every": 1,
        "checkpoint_minutes": 0,
        "rollout.max_new_tokens": 4,
        "rollout.turn_limit": 2,
        "rollout.context_tokens": 1024,
    }
)


class Killed(RuntimeError):
    pass


class KillAfter(BaseReporter):
    """Dies once step ``step``'s rows are written, before any checkpoint after the one it resumes from."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, step, metrics):
        if step == self.step:
            raise Killed(f"killed after step {step}")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    actor = tiny_llama_folder(tmp_path_factory.mktemp("tiny"))
    return BASE.with_overrides(**{"actor.model_path": str(actor)})


@pytest.fixture(scope="module")
def engine(cfg):
    engine = build_engine(cfg)
    yield engine
    engine.close()


def _rows(folder):
    metrics = [(r["kind"], r["step"], r.get("train/episodes")) for r in read_lines(folder / "metrics.jsonl")]
    episodes = Counter(
        ("eval" if e["eval"] else "step", e["step"]) for e in read_lines(folder / "episodes.jsonl")
    )
    return sorted(metrics), dict(episodes)


def _actions(folder):
    return [(e["eval"], e["step"], e.get("actions")) for e in read_lines(folder / "episodes.jsonl")]


def test_a_run_killed_between_checkpoints_and_resumed_has_each_row_once_like_one_that_never_stopped(
    cfg, engine, tmp_path
):
    """Checkpoints after steps 1 and 2; the first attempt dies once step 3's rows are written, before its
    checkpoint; the resumed attempt redoes step 3 from step 2's checkpoint."""
    out = tmp_path / "run"
    with pytest.raises(Killed):
        train(cfg, out_dir=out, engine=engine, reporter=Reporters(file_reporters(out), KillAfter(3)))
    assert _rows(out)[1] == {("eval", 0): 2, ("step", 1): 2, ("step", 2): 2, ("step", 3): 2}
    train(cfg, out_dir=out, resume=out, engine=engine)
    assert repeated_rows(out) == []
    never = [("eval", 0, None), ("eval", 3, None), *(("step", s, 2.0) for s in range(1, 4))]
    # each step's 2 episodes, and each evaluation's 2 (grpo: one column of eval_episodes instances), once
    assert _rows(out) == (never, {("eval", 0): 2, ("eval", 3): 2} | {("step", s): 2 for s in range(1, 4)})
    uninterrupted = tmp_path / "uninterrupted"
    train(cfg, out_dir=uninterrupted, engine=engine)
    assert _rows(uninterrupted) == _rows(out)
    assert _actions(uninterrupted) == _actions(out)  # the resumed step replays what the lost attempt played
