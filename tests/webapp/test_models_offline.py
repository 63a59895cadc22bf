"""Both default models load offline from their packages (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import os

import numpy as np
import torch

from experience.embedding import Embedder
from trainer.models import default_model_path, load_causal_lm, load_tokenizer, prepare_default_models


def test_smollm2_generates_tokens_offline():
    os.environ["HF_HUB_OFFLINE"] = "1"
    path = prepare_default_models()
    assert path == default_model_path()
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path)
    chat = [{"role": "user", "content": "Name a colour."}]
    ids = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    torch.manual_seed(0)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    new = out[0, ids["input_ids"].shape[1] :]
    assert 0 < len(new) <= 8
    assert tokenizer.decode(new, skip_special_tokens=True).strip()


def test_minilm_puts_similar_sentences_closer_than_unrelated_ones():
    os.environ["HF_HUB_OFFLINE"] = "1"
    embedder = Embedder()
    fridge, refrigerator, stocks = (
        "Open the fridge and take out the milk.",
        "Get the milk from the refrigerator.",
        "The stock market fell.",
    )
    a, b, c = embedder.embed([fridge, refrigerator, stocks])
    assert embedder.dim == 384
    assert np.allclose(np.linalg.norm([a, b, c], axis=1), 1.0, atol=1e-5)
    assert a @ b > a @ c + 0.3
