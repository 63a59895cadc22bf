"""Run configuration: validation messages, derived sizes, round-trips, overrides, files and presets."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
import tomllib

import pytest

from trainer import losses, paths
from trainer.config import (
    PRESETS,
    ActorConfig,
    ConfigError,
    ExperienceConfig,
    ExtractorConfig,
    RolloutConfig,
    RunConfig,
    get_preset,
)
from trainer.envs.base import make_mixture

SECTIONS = (ActorConfig, ExtractorConfig, ExperienceConfig, RolloutConfig, RunConfig)


def test_defaults_are_the_papers_values():
    cfg = RunConfig()
    assert (cfg.k_rollouts, cfg.actor.lr, cfg.actor.clip_eps, cfg.actor.grad_clip) == (8, 1e-6, 0.2, 1.0)
    assert cfg.actor.aggregation == "seq-mean-token-mean" and cfg.actor.advantage == "grpo_split"
    ext = cfg.extractor
    assert (ext.eps_low, ext.eps_high, ext.buffer_size, ext.delta, ext.alpha, ext.max_ops) == (
        0.1,
        0.1,
        64,
        1,
        0.5,
        3,
    )
    exp = cfg.experience
    assert (exp.top_k, exp.diversity_lambda, exp.recency_window_s, exp.oversample) == (1, 0.4, 300.0, 16)
    assert (exp.query_batch_size, exp.query_max_wait_s, exp.search_workers) == (16, 0.001, 4)
    assert (exp.merge_every, exp.merge_chunk, exp.capacity, exp.scope) == (5, 5, 20000, "task")
    assert (exp.warmup_steps, exp.search_and_ask_max) == (5, 2)


@pytest.mark.parametrize("section", SECTIONS)
def test_every_field_has_a_docstring(section):
    tree = ast.parse(inspect.getsource(section))
    body = tree.body[0].body
    documented = {
        node.target.id
        for node, nxt in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
    }
    assert documented == {f.name for f in dataclasses.fields(section)}


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunConfig().steps = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"k_rollouts": 7}, "k_rollouts must be even so it splits into guided and free halves (got 7)"),
        ({"k_rollouts": 2}, "each half needs 2 rollouts to compare (got 2)"),
        ({"k_rollouts": 1, "method": "grpo"}, "k_rollouts must be at least 2"),
        ({"method": "ppo"}, "method must be one of complementary, exp_only, grpo, static_online (got 'ppo')"),
        ({"steps": 0}, "steps must be at least 1 (got 0)"),
        ({"no_split": True, "cross_group": True}, "choose one"),
        ({"method": "grpo", "no_merge": True}, "no_merge changes how experience is used, but method 'grpo'"),
        ({"method": "exp_only", "cross_group": True}, "does not train it"),
        (
            {"method": "static_online", "no_reweighting": True},
            "no_reweighting changes the extractor's update",
        ),
        ({"method": "complementary", "frozen_bank": True}, "(method 'complementary' trains πϕ on what it"),
        ({"method": "grpo", "frozen_bank": True}, "static_online can (method 'grpo' uses no bank)"),
        ({"actor.lr": 0}, "actor.lr must be above 0 (got 0.0)"),
        ({"actor.lr": float("nan")}, "actor.lr must be above 0"),
        ({"actor.clip_eps": 1.5}, "actor.clip_eps must be between 0 and 1 (got 1.5)"),
        (
            {"actor.aggregation": "mean"},
            "actor.aggregation must be one of seq-mean-token-mean, seq-mean-token-sum",
        ),
        (
            {"actor.advantage": "gae"},
            "actor.advantage must be one of grpo, grpo_cross, grpo_split (got 'gae')",
        ),
        ({"extractor.policy_loss": "dpo"}, "extractor.policy_loss must be one of cispo, ppo_clip"),
        ({"extractor.eps_low": 1.0}, "extractor.eps_low must be at least 0 and below 1 (got 1.0)"),
        ({"extractor.buffer_size": 0}, "extractor.buffer_size must be at least 1 (got 0)"),
        ({"extractor.alpha": -0.5}, "extractor.alpha must be at least 0 (got -0.5)"),
        ({"extractor.top_p": 1.2}, "extractor.top_p must be above 0 and at most 1"),
        ({"extractor.repetition_penalty": 0}, "extractor.repetition_penalty must be above 0"),
        ({"extractor.kv_cache_gib": 0}, "extractor.kv_cache_gib must be above 0"),
        ({"experience.scope": "global"}, "experience.scope must be one of shared, task (got 'global')"),
        ({"experience.merge_chunk": 1}, "experience.merge_chunk must be at least 2 (got 1)"),
        ({"rollout.engine": "sglang"}, "rollout.engine must be one of hf, vllm (got 'sglang')"),
        ({"rollout.top_p": 0}, "rollout.top_p must be above 0 and at most 1"),
        ({"rollout.turn_limit": 0}, "rollout.turn_limit must be at least 1 (got 0)"),
        ({"rollout.max_new_tokens": 4096, "rollout.context_tokens": 1024}, "to leave room for the prompt"),
        ({"rollout.dtype": "int8"}, "rollout.dtype must be one of auto, bfloat16, float16, float32, native"),
        ({"device": "gpu"}, "device must be auto, cpu, cuda or cuda:N with N a GPU number (got 'gpu')"),
        ({"device": "cuda:x"}, "device must be auto, cpu, cuda or cuda:N"),
    ],
)
def test_it_refuses_bad_values_with_a_message_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        RunConfig().with_overrides(**overrides)
    assert message in str(err.value)


def test_odd_k_is_fine_when_nothing_splits():
    assert RunConfig(method="grpo", k_rollouts=5).free_per_task == 5
    assert RunConfig(no_split=True, k_rollouts=5).guided_per_task == 5


def test_direct_construction_validates_too():
    with pytest.raises(ConfigError, match=r"k_rollouts must be even .* \(got 7\)"):
        RunConfig(k_rollouts=7)
    with pytest.raises(ConfigError, match=r"lr must be above 0 \(got -1"):
        ActorConfig(lr=-1.0)


# ---- derived properties: the method table of docs/design.md §3.5 ----------------------------------------


@pytest.mark.parametrize(
    ("method", "actor_trains", "extractor_trains", "uses_experience"),
    [
        ("grpo", True, False, False),
        ("static_online", True, False, True),
        ("exp_only", False, True, True),
        ("complementary", True, True, True),
    ],
)
def test_method_table(method, actor_trains, extractor_trains, uses_experience):
    cfg = RunConfig(method=method)
    assert (cfg.actor_trains, cfg.extractor_trains, cfg.uses_experience) == (
        actor_trains,
        extractor_trains,
        uses_experience,
    )
    assert cfg.guided_per_task + cfg.free_per_task == cfg.k_rollouts
    assert cfg.guided_per_task == (4 if uses_experience else 0)
    assert cfg.advantage_estimator == ("grpo_split" if uses_experience else "grpo")
    assert cfg.merges == cfg.diversifies == uses_experience
    assert cfg.search_and_ask_limit == (2 if uses_experience else 0)
    assert cfg.reweights == extractor_trains


def test_ablation_switches_change_the_derived_settings():
    base = RunConfig(k_rollouts=8, tasks_per_step=3)
    assert base.rollouts_per_step == 24
    no_split = base.with_overrides(no_split=True)
    assert (no_split.guided_per_task, no_split.free_per_task, no_split.advantage_estimator) == (8, 0, "grpo")
    cross = base.with_overrides(cross_group=True)
    assert (cross.guided_per_task, cross.advantage_estimator) == (4, "grpo_cross")
    assert not base.with_overrides(no_merge=True).merges
    assert base.with_overrides(no_search_and_ask=True).search_and_ask_limit == 0
    assert not base.with_overrides(no_diversification=True).diversifies
    assert not base.with_overrides(no_reweighting=True).reweights
    frozen = base.with_overrides(method="static_online", frozen_bank=True)
    assert (frozen.merges, frozen.distils, frozen.uses_experience) == (False, False, True)
    assert base.distils and base.with_overrides(method="static_online").distils
    for cfg in (base, no_split, cross):
        losses.get_adv_estimator(cfg.advantage_estimator)  # every derived name is registered


# ---- round-trip, overrides, files ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_to_dict_round_trips_through_json(name):
    cfg = get_preset(name).with_overrides(**{"no_merge": True, "rollout.turn_limit": None, "actor.lr": 3e-6})
    data = json.loads(json.dumps(cfg.to_dict()))
    assert RunConfig.from_dict(data) == cfg
    assert data["actor"]["lr"] == 3e-6 and data["rollout"]["turn_limit"] is None


def test_from_dict_fills_missing_keys_with_defaults():
    cfg = RunConfig.from_dict({"steps": 3, "actor": {"lr": 2e-5}})
    assert cfg.steps == 3 and cfg.actor.lr == 2e-5
    assert cfg.actor.clip_eps == 0.2 and cfg.extractor == ExtractorConfig()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"stepz": 3}, "unknown config key 'stepz'; did you mean 'steps'?"),
        ({"actor": {"learning_rate": 1e-5}}, "unknown config key 'actor.learning_rate'"),
        ({"rollout": {"turn_limit": "many"}}, "rollout.turn_limit must be a whole number (got 'many')"),
        ({"k_rollouts": 8.5}, "k_rollouts must be a whole number (got 8.5)"),
        ({"k_rollouts": True}, "k_rollouts must be a whole number (got True)"),
        ({"no_merge": "perhaps"}, "no_merge must be true or false (got 'perhaps')"),
        ({"env": 3}, "env must be text (got 3)"),
        ({"actor": 5}, "actor must be a table of keys (got 5)"),
    ],
)
def test_from_dict_names_the_bad_key(data, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data)
    assert message in str(err.value)


def test_with_overrides_parses_command_line_strings():
    cfg = RunConfig().with_overrides(
        **{
            "actor.lr": "1e-5",
            "k_rollouts": "4",
            "no_merge": "true",
            "rollout.turn_limit": "none",
            "env": "3-task",
        }
    )
    assert (cfg.actor.lr, cfg.k_rollouts, cfg.no_merge, cfg.rollout.turn_limit, cfg.env) == (
        1e-5,
        4,
        True,
        None,
        "3-task",
    )
    assert RunConfig().actor.lr == 1e-6  # the original is untouched


def test_with_overrides_refuses_unknown_keys_and_whole_sections():
    with pytest.raises(ConfigError, match=r"unknown config key 'actor\.lrr'; did you mean 'lr'\?"):
        RunConfig().with_overrides(**{"actor.lrr": 1e-5})
    with pytest.raises(ConfigError, match=r"unknown config key 'critic\.lr'"):
        RunConfig().with_overrides(**{"critic.lr": 1e-5})
    with pytest.raises(ConfigError, match=r"'rollout' is a section; override its fields"):
        RunConfig().with_overrides(rollout={"engine": "hf"})


def test_from_file_json_and_toml_with_a_preset(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('preset = "cpu"\nmethod = "grpo"\nsteps = 7\n\n[actor]\nlr = 2e-5\n')
    cfg = RunConfig.from_file(toml)
    cpu = get_preset("cpu")
    assert (cfg.method, cfg.steps, cfg.actor.lr) == ("grpo", 7, 2e-5)
    assert cfg.actor.micro_batch_size == cpu.actor.micro_batch_size and cfg.rollout == cpu.rollout
    js = tmp_path / "run.json"
    js.write_text(json.dumps(cfg.to_dict()))
    assert RunConfig.from_file(js) == cfg
    bad = tmp_path / "bad.toml"
    bad.write_text('preset = "cpu"\n[actor]\nlrr = 1\n')
    with pytest.raises(ConfigError, match=r"unknown config key 'actor\.lrr'"):
        RunConfig.from_file(bad)
    with pytest.raises(ConfigError, match=r"must end in \.json or \.toml"):
        RunConfig.from_file(tmp_path / "run.yaml")


# ---- presets -------------------------------------------------------------------------------------


def test_presets_are_valid_run_configs():
    assert set(PRESETS) == {"cpu", "gpu-1", "paper"}
    for cfg in PRESETS.values():
        assert RunConfig.from_dict(cfg.to_dict()) == cfg
        assert cfg.method == "complementary"
    assert get_preset("gpu-1").actor.lora.enabled and get_preset("gpu-1").extractor.lora.enabled
    assert get_preset("paper").nproc == 8 and not get_preset("paper").actor.lora.enabled


def test_paper_preset_uses_the_papers_hyper_parameters():
    paper = get_preset("paper")
    assert (paper.k_rollouts, paper.guided_per_task, paper.actor.lr, paper.extractor.buffer_size) == (
        8,
        4,
        1e-6,
        64,
    )
    assert paper.env == "3-task"


def test_cpu_preset_is_small_and_uses_smollm2():
    cpu = get_preset("cpu")
    expected = str(paths.models_dir() / "SmolLM2-135M-Instruct")
    assert cpu.actor.model_path == cpu.extractor.model_path == expected
    assert (cpu.k_rollouts, cpu.guided_per_task, cpu.free_per_task) == (8, 4, 4)
    assert cpu.extractor.buffer_size <= 8 and cpu.actor.lr == 1e-5
    assert cpu.rollout.turn_limit is not None and cpu.rollout.turn_limit <= 10
    assert cpu.rollouts_per_step <= 16


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ConfigError, match="unknown preset 'gpu'; known presets: cpu, gpu-1, paper"):
        get_preset("gpu")


@pytest.mark.parametrize("path", sorted((paths.REPO_ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_the_shipped_config_files_load_and_name_a_registered_env(path):
    cfg = RunConfig.from_file(path)
    assert make_mixture(cfg.env).names
    data = tomllib.loads(path.read_text())
    data.pop("preset", None)
    assert took_effect(data, cfg.to_dict())  # every key of the file, nested tables too


def took_effect(wanted: dict, got: dict) -> bool:
    return all(
        took_effect(value, got[key]) if isinstance(value, dict) else got[key] == value
        for key, value in wanted.items()
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"k_rollouts": 10**9}, "k_rollouts must be at most 256"),
        ({"actor.lr": 1e9}, "lr must be at most 1"),
        ({"steps": 10**12}, "steps must be at most"),
        ({"tasks_per_step": 10**9}, "tasks_per_step must be at most"),
        ({"eval_episodes": 10**12}, "eval_episodes must be at most"),
        ({"tasks_per_step": 4096, "k_rollouts": 256}, "episodes per step"),
        ({"rollout.max_new_tokens": 10**7}, "max_new_tokens must be at most"),
    ],
)
def test_values_that_cannot_run_are_refused_up_front(overrides, message):
    with pytest.raises(ConfigError, match=message):
        get_preset("cpu").with_overrides(**overrides)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:3"])
def test_device_is_auto_by_default_and_round_trips(device):
    assert RunConfig().device == "auto"
    cfg = RunConfig().with_overrides(device=device)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg and cfg.device == device
