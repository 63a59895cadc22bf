"""LoRA through PEFT (trainer.lora): merged weights, the engine after a sync, checkpoints, the config.

Tiny random-initialised Llama models built from a config stand in for SmolLM2 wherever the engine is not
involved; the engine test runs the real SmolLM2 in vLLM (float32), as the full-weight sync tests do.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainer import lora
from trainer.actor import ActorUpdate
from trainer.assemble import load_extractor_model, prepare_actor
from trainer.checkpoint import Checkpointer, check_resumable, read_checkpoint
from trainer.config import ActorConfig, ConfigError, ExtractorConfig, LoraConfig, RunConfig
from trainer.models import default_model_path, load_causal_lm, load_tokenizer, prepare_default_models
from trainer.rollout import GenerationRequest, make_engine, sequence_logprobs

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return prepare_default_models(default_model_path())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm2) -> Path:
    """A 2-layer random Llama (SmolLM2's tokenizer and vocabulary, tied embeddings) as a model folder."""
    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    load_tokenizer(smollm2).save_pretrained(folder)
    return folder


def train_a_little(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    """A few AdamW steps on a fixed sequence, so the adapter (B starts at 0) moves away from the base."""
    ids = torch.arange(1, 17)[None] * 7
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()


def lora_actor(path: Path, rank: int = 4, alpha: float = 8.0, lr: float = 1e-2):
    model = lora.apply_lora(load_causal_lm(path), LoraConfig(rank=rank, alpha=alpha))
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)


# ---- merged weights -------------------------------------------------------------------------------


def test_only_the_adapter_trains(tiny) -> None:
    model, optimizer = lora_actor(tiny)
    base = {k: v.clone() for k, v in load_causal_lm(tiny).state_dict().items()}
    train_a_little(model, optimizer)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    for name, weight in model.state_dict().items():
        if ".lora_" not in name:
            assert torch.equal(weight, base[name.replace(".base_layer", "")]), name
    assert len(optimizer.state) == len(trained)  # AdamW state for the adapter alone


def test_merged_weights_equal_base_plus_b_a_alpha_over_r(tiny) -> None:
    rank, alpha = 4, 8.0
    model, optimizer = lora_actor(tiny, rank, alpha)
    train_a_little(model, optimizer)
    base = load_causal_lm(tiny).state_dict()
    params = dict(model.named_parameters())
    merged = lora.served_state_dict(model)
    assert merged.keys() == base.keys()  # the base model's names: what an engine loads
    changed = 0
    for name, weight in merged.items():
        layer = name.removesuffix(".weight")
        if layer.rsplit(".", 1)[-1] in TARGETS:
            a = params[f"{layer}.lora_A.default.weight"]  # (r, in)
            b = params[f"{layer}.lora_B.default.weight"]  # (out, r)
            want = base[name] + b.detach() @ a.detach() * (alpha / rank)
            torch.testing.assert_close(weight, want, atol=1e-6, rtol=1e-5)
            changed += not torch.equal(weight, base[name])
        else:
            assert torch.equal(weight, base[name]), name
    assert changed == 2 * len(TARGETS)  # every targeted layer of both decoder layers moved


def test_a_model_holding_the_merged_weights_computes_what_the_lora_model_does(tiny) -> None:
    model, optimizer = lora_actor(tiny)
    train_a_little(model, optimizer)
    plain = load_causal_lm(tiny)
    plain.load_state_dict(lora.served_state_dict(model))
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_on_cuda_the_frozen_base_is_held_in_bfloat16_and_only_the_adapter_trains(tiny) -> None:
    """What ``prepare_actor`` does on CUDA (``placement.param_dtype``), run on the CPU under autocast."""
    model, optimizer = lora_actor(tiny)
    lora.frozen_in(model, torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train_a_little(model, optimizer)
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)
    merged = lora.served_state_dict(model)
    assert merged["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert lora.frozen_in(load_causal_lm(tiny), torch.bfloat16).dtype == torch.float32  # plain: unchanged


# ---- the engine -----------------------------------------------------------------------------------


def test_after_a_sync_the_engines_logprobs_match_the_lora_trainers(smollm2) -> None:
    """As tests/trainer/rollout/test_vllm.py's weight-sync parity for full weights, through the actor's
    own ``sync``: float32 engine, the same 1e-3 tolerance."""
    tokenizer = load_tokenizer(smollm2)
    chat = [{"role": "user", "content": "Which way is the staircase?"}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    model = lora.apply_lora(load_causal_lm(smollm2), LoraConfig(rank=8, alpha=16))
    actor = ActorUpdate(model, ActorConfig(lr=5e-3, lora=LoraConfig(rank=8)), estimator="grpo")
    engine = make_engine(
        "vllm", smollm2, dtype="float32", max_model_len=512, kv_cache_memory_bytes=128 << 20, warmup=False
    )
    try:
        (before,) = engine.generate([GenerationRequest(tuple(prompt), max_new_tokens=16, temperature=0.0)])
        completion = before.token_ids
        for _ in range(2):  # raise the greedy answer's log-probs: the adapter moves, B·A is no longer 0
            actor.optimizer.zero_grad()
            (-sequence_logprobs(model, [prompt], [completion])[0].sum()).backward()
            actor.optimizer.step()
        with torch.no_grad():
            (want,) = sequence_logprobs(model, [prompt], [completion])
        assert (want - torch.tensor(before.logprobs)).abs().max() > 1e-2  # the premise: weights moved
        actor.sync(engine, version=1)
        (after,) = engine.score([prompt], [completion])
        torch.testing.assert_close(torch.tensor(after), want, atol=1e-3, rtol=0)
        (sampled,) = engine.generate([GenerationRequest(tuple(prompt), max_new_tokens=16, temperature=0.0)])
        assert sampled.weight_version == 1
        with torch.no_grad():
            (recomputed,) = sequence_logprobs(model, [prompt], [sampled.token_ids])
        torch.testing.assert_close(torch.tensor(sampled.logprobs), recomputed, atol=1e-3, rtol=0)
    finally:
        engine.close()


# ---- checkpoints ----------------------------------------------------------------------------------


def lora_run_config(tiny: Path, rank: int = 4) -> RunConfig:
    return RunConfig(
        method="grpo",
        steps=3,
        actor=ActorConfig(model_path=str(tiny), lr=1e-2, lora=LoraConfig(rank=rank, alpha=8.0)),
    )


def test_resume_from_a_lora_checkpoint_gives_the_same_weights_and_optimiser(tiny, tmp_path) -> None:
    cfg = lora_run_config(tiny)
    tokenizer, model, actor = prepare_actor(cfg, tmp_path / "run")
    assert lora.is_lora(model)
    train_a_little(model, actor.optimizer)
    folder = Checkpointer(tmp_path / "run", cfg, actor, tokenizer).save(1, engine_version=1, elapsed_s=1.0)
    assert lora.has_adapter(folder / lora.ADAPTER_DIR)
    _, resumed, resumed_actor = prepare_actor(cfg, tmp_path / "again")
    Checkpointer(tmp_path / "again", cfg, resumed_actor, tokenizer).load(read_checkpoint(folder))
    for (name, p), (_, q) in zip(model.named_parameters(), resumed.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    # the optimiser's moments came back too: one more step on each keeps them equal
    train_a_little(model, actor.optimizer, 1)
    train_a_little(resumed, resumed_actor.optimizer, 1)
    for (name, p), (_, q) in zip(model.named_parameters(), resumed.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)


def test_a_lora_checkpoints_actor_folder_is_the_merged_model_and_the_adapter_merges_alone(
    tiny, tmp_path
) -> None:
    model, optimizer = lora_actor(tiny)
    train_a_little(model, optimizer)
    trained = SimpleNamespace(model=model, optimizer=optimizer)
    checkpointer = Checkpointer(tmp_path, lora_run_config(tiny), trained, load_tokenizer(tiny))
    folder = checkpointer.save(2, engine_version=2, elapsed_s=0.0)
    want = lora.served_state_dict(model)
    exported = load_causal_lm(folder / "actor").state_dict()  # what evaluate_checkpoint's engine loads
    merged_alone = tmp_path / "merged"
    assert lora.main(["merge", str(folder / lora.ADAPTER_DIR), str(merged_alone)]) == 0
    for got in (exported, load_causal_lm(merged_alone).state_dict()):
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=0, rtol=0, msg=name)
    assert load_tokenizer(merged_alone).eos_token_id == load_tokenizer(tiny).eos_token_id


def test_the_extractor_resumes_from_its_adapter(tiny, tmp_path) -> None:
    x = ExtractorConfig(model_path=str(tiny), lora=LoraConfig(rank=4, alpha=8.0))
    model = load_extractor_model(x, None)
    train_a_little(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    model.save_pretrained(tmp_path / "extractor")  # what trainer.coevolution writes into a checkpoint
    resumed = load_extractor_model(x, tmp_path / "extractor")
    for (name, p), (_, q) in zip(model.named_parameters(), resumed.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_an_adapter_of_another_rank_is_refused_with_a_message(tiny, tmp_path) -> None:
    model, _ = lora_actor(tiny, rank=4)
    lora.save_adapter(model, tmp_path / "r4")
    other, _ = lora_actor(tiny, rank=8)
    with pytest.raises(ValueError, match="does not fit this model's adapter"):
        lora.load_adapter(other, tmp_path / "r4")
    with pytest.raises(FileNotFoundError, match="no LoRA adapter"):
        lora.load_adapter(other, tmp_path)


# ---- the config -----------------------------------------------------------------------------------


def test_lora_settings_round_trip_and_show_in_config_changes() -> None:
    cfg = RunConfig().with_overrides(
        **{"actor.lora.rank": 16, "extractor.lora.target_modules": "q_proj,v_proj"}
    )
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["actor"]["lora"] == {
        "rank": 16,
        "alpha": 32.0,
        "dropout": 0.0,
        "target_modules": "all-linear",
    }
    assert not RunConfig().actor.lora.enabled  # off by default
    with pytest.raises(ConfigError, match=r"actor\.lora\.rank: 16 in the checkpoint, 8 now"):
        check_resumable(cfg, cfg.with_overrides(**{"actor.lora.rank": 8}))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("actor.lora.rank", -1, r"actor\.lora\.rank must be at least 0"),
        ("actor.lora.rank", "four", r"actor\.lora\.rank must be a whole number"),
        ("extractor.lora.alpha", 0, r"extractor\.lora\.alpha must be above 0"),
        ("actor.lora.dropout", 1.0, r"actor\.lora\.dropout must be at least 0 and below 1"),
        ("actor.lora.target_modules", "q proj", r"target_modules must be all-linear or comma-separated"),
        ("actor.lora.rnak", 4, r"unknown config key 'actor\.lora\.rnak'; did you mean 'rank'"),
    ],
)
def test_a_bad_lora_setting_is_refused_with_a_message(key: str, value, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig().with_overrides(**{key: value})


def test_lora_with_several_processes_is_refused_with_a_message() -> None:
    with pytest.raises(ConfigError, match=r"actor\.lora trains in one process .*got nproc 2"):
        RunConfig().with_overrides(**{"actor.lora.rank": 8, "nproc": 2})


def test_target_modules_the_model_lacks_are_refused_with_a_message(tiny) -> None:
    with pytest.raises(ConfigError, match="lora.target_modules"):
        lora.apply_lora(load_causal_lm(tiny), LoraConfig(rank=4, target_modules="c_attn"))
