"""A checkpoint carries the seconds its run had trained, so a resumed run's clock goes on from them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from trainer.checkpoint import Checkpointer, read_checkpoint
from trainer.config import get_preset
from trainer.report import RunClock

CFG = get_preset("cpu")


def _save(out_dir, step: int, elapsed_s: float):
    """A real checkpoint of a tiny Llama (one layer, 8 dims) and a word-level tokenizer."""
    config = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1)  # fmt: skip
    model = LlamaForCausalLM(config)
    vocab = Tokenizer(WordLevel({"[UNK]": 0, "go": 1}, unk_token="[UNK]"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocab, unk_token="[UNK]")
    actor = SimpleNamespace(model=model, optimizer=torch.optim.AdamW(model.parameters()))
    return Checkpointer(out_dir, CFG, actor, tokenizer).save(step, engine_version=step, elapsed_s=elapsed_s)


def test_a_checkpoint_keeps_the_seconds_trained_and_a_clock_started_from_them_goes_on(tmp_path):
    _save(tmp_path, 3, elapsed_s=671.5)
    state = read_checkpoint(tmp_path)
    assert (state.step, state.elapsed_s) == (3, 671.5)
    clock = RunClock(state.elapsed_s)
    first = clock()
    assert 671.5 <= first < 672.5 and clock() >= first


def test_a_checkpoint_saved_before_the_seconds_were_kept_resumes_from_zero(tmp_path):
    folder = _save(tmp_path, 2, elapsed_s=30.0)
    state = json.loads((folder / "state.json").read_text())
    del state["elapsed_s"]  # as written by a version without it
    (folder / "state.json").write_text(json.dumps(state))
    assert read_checkpoint(tmp_path).elapsed_s == 0.0


def test_a_new_clock_starts_at_zero():
    assert RunClock()() == pytest.approx(0.0, abs=0.5)
