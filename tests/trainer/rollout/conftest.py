"""Shared pieces for the rollout engine tests: the default model, its tokenizer, chat prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.models import default_model_path, load_tokenizer, prepare_default_models


@pytest.fixture(scope="session")
def model_path() -> Path:
    return prepare_default_models(default_model_path())


@pytest.fixture(scope="session")
def tokenizer(model_path):
    return load_tokenizer(model_path)


@pytest.fixture(scope="session")
def chat(tokenizer):
    """Token ids of a one-message chat prompt, ready for the assistant's answer."""

    def encode(message: str) -> tuple[int, ...]:
        messages = [{"role": "user", "content": message}]
        return tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])

    return encode
