"""Rollout engines (vLLM, transformers) behind one interface; see ``base.py``.

``make_engine("vllm" | "hf", model_path, **options)`` builds one; backends import lazily.
"""

from trainer.rollout.base import (
    ENGINE_BACKENDS,
    Engine,
    EngineError,
    FinishReason,
    Generation,
    GenerationRequest,
    engine_class,
    make_engine,
    sequence_logprobs,
)

__all__ = [
    "ENGINE_BACKENDS",
    "Engine",
    "EngineError",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "engine_class",
    "make_engine",
    "sequence_logprobs",
]
