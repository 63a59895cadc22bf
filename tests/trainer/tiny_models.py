"""Tiny random-initialised models built from a config (no download), for multi-process tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, LlamaForCausalLM

from trainer.models import default_model_path, load_tokenizer, prepare_default_models


def tiny_llama_folder(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Llama of width 128 (head size 64, which vLLM's CPU attention supports) with SmolLM2's
    vocabulary, tokenizer and chat template, saved as a Hugging Face folder that any engine loads."""
    source = prepare_default_models(default_model_path())
    cfg = AutoConfig.from_pretrained(source)
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 128, 256, 2
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 2, 1, 64
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(folder, safe_serialization=True)
    load_tokenizer(source).save_pretrained(folder)
    return Path(folder)
