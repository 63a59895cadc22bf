"""Shared pieces for the rollout engine tests: the default model, its tokenizer, chat prompts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainer.models import default_model_path, load_tokenizer, prepare_default_models
from trainer.rollout import GenerationRequest


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


@pytest.fixture(scope="session")
def check_min_new_tokens(chat):
    """Asserts that ``min_new_tokens`` holds back the end of one request and leaves its neighbour alone."""

    def check(engine) -> None:
        prompt = chat("Answer with one word: yes or no?")
        short = GenerationRequest(prompt, max_new_tokens=12, temperature=0.0)
        (free,) = engine.generate([short])
        assert free.finish_reason == "stop" and len(free.token_ids) < 12  # the premise: it stops early
        held, unaffected = engine.generate([replace(short, min_new_tokens=12), short])
        assert held.finish_reason == "length" and len(held.token_ids) == 12
        assert held.token_ids[: len(free.token_ids) - 1] == free.token_ids[:-1]  # same words, EOS held back
        assert free.token_ids[-1] not in held.token_ids[: len(free.token_ids)]
        assert unaffected.token_ids == free.token_ids

    return check
