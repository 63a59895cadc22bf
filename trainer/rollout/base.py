"""The rollout engine interface: requests in, generations out, weights synced in place.

Engines are pluggable backends (like Django's session backends): one base class here, one module per
backend (``hf``, ``vllm``), picked by name with :func:`make_engine`. Every backend follows the same
conventions, so the trainer never needs to know which one produced a batch:

- all requests of a ``generate`` call run as one batch;
- ``Generation.token_ids`` include the token that stopped the generation (EOS or a stop token), so the
  policy is trained on when to stop;
- ``Generation.logprobs`` are the log-probabilities of the sampled tokens under the *raw* model
  distribution (before temperature and top-p), which is what vLLM reports and what
  :func:`sequence_logprobs` recomputes under the trainer's model;
- every generation carries the weight version of the engine that produced it; ``update_weights``
  refuses a version that does not increase, so stale weights fail loudly.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length"]


class EngineError(RuntimeError):
    """A rollout engine cannot be built or used as asked; the message says what to change."""


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to sample from a tokenised prompt."""

    prompt_ids: tuple[int, ...]
    """The prompt, already tokenised (chat template applied by the caller)."""
    max_new_tokens: int = 64
    """Upper bound on generated tokens; reaching it gives finish reason ``"length"``."""
    min_new_tokens: int = 0
    """Stop tokens (EOS included) cannot end the generation before this many tokens."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    repetition_penalty: float = 1.0
    """CTRL's penalty on every token already in the prompt or the completion: its logit is divided by this
    when positive, multiplied when negative (1: off; vLLM's and transformers' definition). Reported
    log-probs stay the raw model's."""
    seed: int | None = None
    """Per-request sampling seed: the same request with the same seed gives the same completion."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra tokens that end the generation (the model's EOS always does); they are kept in the output."""
    json_schema: Mapping[str, Any] | None = None
    """If given, the completion is constrained to JSON valid under this schema (vLLM engine only)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not self.prompt_ids:
            raise ValueError("a generation request needs at least one prompt token")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}"
            )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be above 0, got {self.repetition_penalty}")


@dataclass
class Generation:
    """What an engine sampled for one request."""

    token_ids: list[int]
    """The completion, including the stop token when the finish reason is ``"stop"``."""
    logprobs: list[float]
    """Raw-model log-probability of each token in ``token_ids`` (same length)."""
    finish_reason: FinishReason
    """``"stop"``: EOS or a stop token was sampled; ``"length"``: ``max_new_tokens`` was reached."""
    text: str
    """The completion decoded without special tokens."""
    weight_version: int = 0
    """The engine's weight version when this completion was sampled."""


class Engine(ABC):
    """Base class of rollout engines. Construction loads the model; ``close()`` frees it.

    Subclasses implement ``_generate``, ``_score``, ``_load_weights`` and ``_close``; this class validates
    inputs, stamps weight versions and guards against use after close.
    """

    name: str = ""

    def __init__(self, model_path: Path | str) -> None:
        self.model_path = Path(model_path)
        self._weight_version = 0
        self._closed = False

    @property
    def weight_version(self) -> int:
        """The version of the weights currently served (0: the checkpoint's own weights)."""
        return self._weight_version

    @property
    def closed(self) -> bool:
        return self._closed

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample one completion per request, all in one batch; results keep the request order."""
        self._check_open()
        if not requests:
            return []
        generations = self._generate(list(requests))
        for generation in generations:
            generation.weight_version = self._weight_version
        return generations

    def score(
        self, prompt_ids_list: Sequence[Sequence[int]], completion_ids_list: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Raw-model log-probability of every token of given completions under the served weights.

        The check that an engine serves the trainer's weights: compare with :func:`sequence_logprobs`.
        """
        self._check_open()
        if len(prompt_ids_list) != len(completion_ids_list):
            raise ValueError("score needs as many prompts as completions")
        if any(not c for c in completion_ids_list) or any(not p for p in prompt_ids_list):
            raise ValueError("score needs non-empty prompts and completions")
        return self._score([list(p) for p in prompt_ids_list], [list(c) for c in completion_ids_list])

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Serve new weights (a trainer model's ``state_dict()``) from now on, stamped ``version``."""
        self._check_open()
        if version <= self._weight_version:
            raise EngineError(
                f"{self.name} engine: weight version {version} is not newer than the served "
                f"version {self._weight_version}; versions must increase with every update"
            )
        self._load_weights(state_dict)
        self._weight_version = version

    @contextlib.contextmanager
    def asleep(self) -> Iterator[None]:
        """Give the device memory this engine holds back while the block runs (the trainer's step): vLLM's
        sleep mode on CUDA (``rollout.sleep``); elsewhere the engine simply stays as it is."""
        self._check_open()
        self._sleep()
        try:
            yield
        finally:
            self._wake_up()

    def _sleep(self) -> None:  # noqa: B027 - only engines with a sleep mode override it
        """Free the engine's device memory until ``_wake_up``."""

    def _wake_up(self) -> None:  # noqa: B027
        """Take the memory ``_sleep`` gave back, ready to generate again."""

    def reset_cache(self) -> None:
        """Forget cached prompt prefixes (every weight update does this; benchmarks start cold with it)."""
        self._check_open()
        self._reset_cache()

    def close(self) -> None:
        """Free the model and its memory; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"{self.name} engine for {self.model_path} is closed")

    @abstractmethod
    def _generate(self, requests: list[GenerationRequest]) -> list[Generation]: ...

    @abstractmethod
    def _score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]: ...

    @abstractmethod
    def _load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def _reset_cache(self) -> None: ...

    @abstractmethod
    def _close(self) -> None: ...


# name -> "module:Class"; imported on first use so that `import vllm` (~7 s) only happens when asked.
ENGINE_BACKENDS: dict[str, str] = {
    "hf": "trainer.rollout.hf:HFEngine",
    "vllm": "trainer.rollout.vllm:VLLMEngine",
}


def engine_class(name: str) -> type[Engine]:
    """The engine class registered under ``name``."""
    try:
        target = ENGINE_BACKENDS[name]
    except KeyError:
        raise EngineError(
            f"unknown rollout engine {name!r}; choose one of {', '.join(sorted(ENGINE_BACKENDS))}"
        ) from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make_engine(name: str, model_path: Path | str, **options: Any) -> Engine:
    """Build the engine ``name`` ("vllm" or "hf") for the model folder ``model_path``; a ``dtype`` of
    "native" is resolved for this machine first (``resolve_dtype``)."""
    if "dtype" in options:
        options["dtype"] = resolve_dtype(options["dtype"])
    return engine_class(name)(model_path, **options)


def native_bf16() -> bool:
    """Whether this machine computes bfloat16 in hardware: a CUDA GPU that supports it, or a CPU with
    AVX512-BF16 or AMX tiles (the probes vLLM's CPU backend uses). Elsewhere bf16 is emulated: on an
    AVX2-only CPU vLLM's own bf16 GEMMs are 2-5x slower than float32 (``benchmarks/bench_engines.py``,
    ``bench_bf16_route.py``), so the vLLM engine routes them through float32 there
    (``trainer.rollout.vllm``)."""
    import torch  # heavy: this module is imported where no model runs (see ``TYPE_CHECKING`` above)

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def resolve_dtype(dtype: str) -> str:
    """The inference dtype an engine is given: "native" is bfloat16 where the hardware has it
    (``native_bf16``), float32 elsewhere; any other name is kept as it is."""
    if dtype != "native":
        return dtype
    return "bfloat16" if native_bf16() else "float32"


def sequence_logprobs(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    completion_ids_list: Sequence[Sequence[int]],
    *,
    batch_size: int = 16,
    masks: Sequence[Sequence[int]] | None = None,
) -> list[torch.Tensor]:
    """Log-probability of every completion token under ``model``, given its prompt.

    Returns one 1-D float32 tensor per completion (length = completion length), on the model's
    device. Gradients flow when the caller's grad mode allows it; wrap in ``torch.no_grad()`` to
    recompute old log-probs. Sequences are right-padded in minibatches of ``batch_size``.

    With ``masks`` (1 = needed, one per completion) only those tokens are scored; the others read 0.
    The vocabulary projection is applied only at the scored positions, not at every position of the
    sequence: in a multi-turn episode the actor's own tokens are a few percent of it, and the full
    (B, T, vocab) logits tensor would be most of the step's memory and a fifth of its compute.
    """

    if len(prompt_ids_list) != len(completion_ids_list):
        raise ValueError("sequence_logprobs needs as many prompts as completions")
    if masks is None:
        masks = [[1] * len(c) for c in completion_ids_list]
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for start in range(0, len(prompt_ids_list), batch_size):
        window = slice(start, start + batch_size)
        out += _minibatch_logprobs(
            model, prompt_ids_list[window], completion_ids_list[window], masks[window], device
        )
    return out


def _minibatch_logprobs(model, prompts, completions, masks, device) -> list[torch.Tensor]:
    import torch  # heavy: this module is imported where no model runs

    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    B, T = len(seqs), max(len(s) for s in seqs)
    input_ids = torch.zeros(B, T, dtype=torch.long, device=device)
    attention_mask = torch.zeros(B, T, dtype=torch.long, device=device)
    for i, seq in enumerate(seqs):
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[i, : len(seq)] = 1
    # the token at position t is predicted by the output at t - 1
    rows, cols, where = [], [], []
    for i, (prompt, mask) in enumerate(zip(prompts, masks, strict=True)):
        kept = [t for t, m in enumerate(mask) if m]
        rows += [i] * len(kept)
        cols += [len(prompt) - 1 + t for t in kept]
        where.append(kept)
    rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
    logits = _logits_at(model, input_ids, attention_mask, rows_t, cols_t).float()  # (N, V)
    targets = input_ids[rows_t, cols_t + 1]
    picked = logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)
    out, n = [], 0
    for completion, kept in zip(completions, where, strict=True):
        row = torch.zeros(len(completion), dtype=torch.float32, device=device)
        if kept:
            row = row.index_put((torch.tensor(kept, device=device),), picked[n : n + len(kept)])
        out.append(row)
        n += len(kept)
    return out


def _logits_at(model, input_ids, attention_mask, rows, cols) -> torch.Tensor:
    """The model's logits at positions (rows[i], cols[i]): the decoder once, the output head only there.

    Models that post-process logits (soft-capping, scaling) go through their own full forward instead.
    A model sharded with FSDP2 must run its root's forward (which gathers the embedding, final norm and
    head), so it keeps only the wanted columns through ``logits_to_keep``: the head then runs at the union
    of those positions in every row.
    """
    # heavy: this module is imported where no model runs
    import torch
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        keep, where = torch.unique(cols, return_inverse=True)  # (U,), (N,) index into keep
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
        return logits[rows, where]  # (B, U, V) -> (N, V)
    head = model.get_output_embeddings()
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    post = any(getattr(model.config, k, None) for k in ("final_logit_softcapping", "logit_scale"))
    if head is None or base is None or post:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[rows, cols]
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return head(hidden[rows, cols])


def engine_from_config(
    model_path: Path | str, rollout: Any, *, seed: int = 0, name: str = "", device: str = "auto"
) -> Engine:
    """An engine for ``model_path`` set up from a ``RolloutConfig`` (backend: ``name`` or its ``engine``).
    ``device`` is the run's (``RunConfig.device``): the hf engine's model lives there (vLLM places itself;
    under torchrun, ``cuda`` is this rank's GPU)."""
    name = name or rollout.engine
    if name == "vllm":
        return make_engine(
            "vllm",
            model_path,
            dtype=rollout.dtype,
            max_model_len=rollout.context_tokens,
            kv_cache_memory_bytes=int(rollout.kv_cache_gib * 2**30),
            seed=seed,
            sleep_mode=rollout.sleep,
        )
    from trainer.parallel import resolve_device  # imports torch, which this module leaves to model code

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return make_engine(name, model_path, dtype=rollout.dtype, device=str(resolve_device(device, local_rank)))
