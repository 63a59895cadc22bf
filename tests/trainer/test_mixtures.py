"""The paper's task mixtures train: one real actor step of ``complementary`` on ``6-task`` (its six envs hold
``3-task``'s three, so that mixture's step runs the same code on a subset and is not trained again here;
tests/trainer/test_config.py checks the paper preset names it).

Real SmolLM2-135M actor and extractor on two in-process vLLM engines, the real bank
(PostgreSQL + pgvector through ExperienceManager), the real environments; one task instance per env
(a seed whose step-1 sample covers the mixture), K = 4, two turns of a few tokens. The bank starts with one
entry per env scope, so that guided rollouts retrieve from step 1 on and the test sees which scope each
one read; distillation then writes new entries, which must land in the scope of the env they came from.
"""

from __future__ import annotations

import pytest

from experience.manager import ExperienceManager
from experience.models import Experience
from tests.trainer.recording import Recorder
from trainer.assemble import build_engine, build_extractor_engine, file_reporters, train
from trainer.config import RunConfig, get_preset
from trainer.envs import make_mixture
from trainer.experiments.report.evaluation import table1_section
from trainer.experiments.report.runs import load_results
from trainer.loop import sample_tasks
from trainer.models import default_model_path, prepare_default_models
from trainer.store import Add
from webapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

BASE = get_preset("cpu").with_overrides(
    **{
        "method": "complementary",
        "steps": 1,
        "k_rollouts": 4,
        "eval_every": 0,
        "eval_episodes": 1,
        "checkpoint_every": 0,
        "experience.warmup_steps": 0,
        "extractor.max_new_tokens": 128,
        "extractor.trajectory_chars": 400,
        "rollout.max_new_tokens": 8,
        "rollout.turn_limit": 2,
        "rollout.kv_cache_gib": 0.5,
    }
)


def mixture_config(mixture: str) -> RunConfig:
    """``BASE`` on ``mixture``, one task instance per env: the first seed whose step 1 samples every env."""
    names = set(make_mixture(mixture).names)
    cfg = BASE.with_overrides(env=mixture, tasks_per_step=len(names))
    for seed in range(10_000):
        if {s.env_name for s in sample_tasks(cfg.with_overrides(seed=seed), 1)} == names:
            return cfg.with_overrides(seed=seed)
    raise AssertionError(f"no seed below 10,000 samples every env of {mixture} at step 1")


def test_the_6_task_mixture_holds_the_3_task_mixtures_envs():
    assert set(make_mixture("3-task").names) < set(make_mixture("6-task").names)


@pytest.fixture(scope="module")
def engines():
    prepare_default_models(default_model_path())
    actor, extractor = build_engine(BASE), build_extractor_engine(BASE)
    yield actor, extractor
    actor.close()
    extractor.close()


def train_one_step(mixture: str, engines, user, tmp_path):
    """One step of ``mixture`` into ``tmp_path/runs/<mixture>-s0`` (an experiment cell's layout)."""
    cfg = mixture_config(mixture)
    run = Run.objects.create(name=mixture, owner=user, method=cfg.method, env=cfg.env, config=cfg.to_dict())
    out = tmp_path / "runs" / f"{mixture}-s0"
    recorder = Recorder()
    actor_engine, extractor_engine = engines
    with ExperienceManager(run.pk) as store:
        seeded = store.apply(
            [Add(env, f"{env} advice", f"How to do well in {env}.") for env in make_mixture(mixture).names],
            step=0,
        )
        train(
            cfg,
            out_dir=out,
            reporter=file_reporters(out, recorder),
            engine=actor_engine,
            extractor_engine=extractor_engine,
            store=store,
        )
    return cfg, run, recorder, {r.entry_id: r.op.scope for r in seeded}


def check_mixture_step(mixture: str, engines, user, tmp_path) -> None:
    cfg, run, recorder, seeded = train_one_step(mixture, engines, user, tmp_path)
    names = make_mixture(mixture).names
    k = cfg.k_rollouts

    # one actor step trained and synced to the engine; the step and the final eval were reported
    step = recorder.steps[1]
    assert sorted(recorder.evals) == [0, 1]
    assert step["train/episodes"] == k * len(names) and "adv/zero_groups_frac" in step
    assert step["engine/weight_version"] >= 1

    # per-env training metrics: each env played its K rollouts, half of them guided
    for env in names:
        assert step[f"train/{env}/episodes"] == k, env
        assert step[f"train/guided/{env}/episodes"] == step[f"train/free/{env}/episodes"] == k // 2, env
        for key in ("success", "reward", "actions", "invalid_frac", "truncated_frac"):
            assert f"train/{env}/{key}" in step, (env, key)
        assert 1 <= step[f"train/{env}/actions"] <= cfg.rollout.turn_limit

    # guided rollouts read their own env's scope: every one got its env's seeded entry
    guided = [e for e in recorder.batches[1] if e.spec.guided]
    assert len(guided) == len(names) * k // 2
    assert all(seeded[e.experience.entry_id] == e.spec.env_name for e in guided)

    # distillation wrote experiences into each env's own scope (the episode id names the env)
    distilled = Experience.objects.filter(run=run, created_step=1)
    assert {e.scope for e in distilled} == set(names)
    assert all(e.source_episode.split("/")[1] == e.scope for e in distilled)

    # evaluation per env, both columns, averaged over envs; the report shows the paper's Table 1 layout
    for when, metrics in recorder.evals.items():
        for col in ("", "with_exp/"):
            per_env = [metrics[f"eval/{col}{env}/success"] for env in names]
            assert metrics[f"eval/{col}success"] == pytest.approx(sum(per_env) / len(names)), (when, col)
            assert all(metrics[f"eval/{col}{env}/episodes"] == cfg.eval_episodes for env in names)
    table = table1_section(load_results(tmp_path)).splitlines()
    header = next(line for line in table if line.startswith("| arm"))
    row = next(line for line in table if line.startswith(f"| {mixture}"))
    columns = [f"{env} (w/o exp)" for env in names] + [f"{env} (w/ exp)" for env in names]
    assert all(c in header for c in columns + ["average (w/o exp)", "average (w/ exp)"])
    assert "–" not in row and row.count("|") == header.count("|")


@pytest.mark.timeout(900)
def test_one_complementary_step_on_the_6_task_mixture(engines, user, tmp_path):
    check_mixture_step("6-task", engines, user, tmp_path)
