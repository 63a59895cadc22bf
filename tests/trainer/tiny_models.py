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


COMPASS = (" north", " south", " east", " west", " northeast", " northwest", " southeast", " southwest")


def walking_llama_folder(folder: Path, seed: int = 0, step_logit: float = 15.0, stop_logit: float = 15.0):
    """``tiny_llama_folder``'s model made to walk, so that a run of it wins some episodes and trains (a random
    model never names a move, so every reward is 0 and nothing updates): its input embeddings are one large
    vector plus noise, so the last hidden state points (nearly) one way whatever the prompt, and its untied
    head gives that direction a logit of about ``step_logit`` for each compass word (0.05 apart) and
    ``stop_logit`` for the end of the turn, 0 for every other token. A reply is then a few compass words,
    drawn independently (about 1 turn in 10 ends at once, an invalid action; under 1 % of tokens are
    others), and MiniHack plays the first: a random walk, which wins some episodes of
    ``MiniHack-Room-Random-5x5`` within 15 turns, about 3 in 10."""
    folder = tiny_llama_folder(folder, seed)
    model = LlamaForCausalLM.from_pretrained(folder, tie_word_embeddings=False)
    tokenizer = load_tokenizer(folder)
    torch.manual_seed(seed + 1)
    direction = torch.randn(model.config.hidden_size)
    direction *= 8.0 / direction.pow(2).mean().sqrt()  # root mean square 8, far above the layers' outputs
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed.copy_(direction + 0.02 * torch.randn_like(embed))
        unit = direction / direction.pow(2).mean().sqrt()  # what the final RMSNorm (weight 1) makes of it
        logit_one = unit / unit.dot(unit)  # a head row giving the hidden state a logit of 1
        head = model.lm_head.weight
        head.zero_()
        for i, word in enumerate(COMPASS):  # 0.05 apart, so that greedy decoding has no near-tie to flip
            (token,) = tokenizer.encode(word, add_special_tokens=False)
            head[token] = (step_logit + 0.05 * i) * logit_one
        head[tokenizer.eos_token_id] = stop_logit * logit_one
    model.config.tie_word_embeddings = False
    model.save_pretrained(folder, safe_serialization=True)
    return folder
