"""The transformers backend: ``model.generate`` over a left-padded batch. The fallback and the test reference.

``generate`` has one sampling setting and one global RNG per call, but rollouts need per-request
temperature, top-p, seed, stop tokens and length. So generate runs greedy over scores that our own
sampler has already reduced to a single token per row: the sampler (a logits processor) draws each
row's token with that row's settings and its own ``torch.Generator``, records the raw log-prob, and
a stopping criterion ends each row on its own terms. Every request keeps its settings inside one
batched call; nothing is grouped.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from trainer.models import ModelNotFound, is_checkpoint, load_causal_lm, load_tokenizer
from trainer.rollout.base import (
    Engine,
    EngineError,
    Generation,
    GenerationRequest,
    native_bf16,
    sequence_logprobs,
)

log = logging.getLogger(__name__)


class _RowSampler:
    """Samples one token per row with that row's settings and records it with its raw log-prob."""

    def __init__(self, requests: list[GenerationRequest], eos_token_ids: set[int], device: torch.device):
        B = len(requests)
        self.requests = requests
        self.stop_ids = [eos_token_ids | set(r.stop_token_ids) for r in requests]
        self.generators = []
        for r in requests:
            g = torch.Generator(device=device)
            g.manual_seed(r.seed if r.seed is not None else random.getrandbits(63))
            self.generators.append(g)
        self.temperature = torch.tensor([r.temperature for r in requests], device=device)
        self.top_p = torch.tensor([r.top_p for r in requests], device=device)
        self.penalty = torch.tensor([r.repetition_penalty for r in requests], device=device)
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.logprobs: list[list[float]] = [[] for _ in range(B)]
        self.finish: list[str | None] = [None] * B

    def sample(self, scores: torch.Tensor) -> torch.Tensor:
        B, V = scores.shape
        logp = scores.log_softmax(-1)  # raw-model log-probs, the convention of every engine
        # temperature 0 is greedy: divide by 1 and take the argmax below
        greedy = self.temperature == 0
        scores = self._penalise_repeats(self._hold_stops(scores))
        probs = (scores / torch.where(greedy, 1.0, self.temperature)[:, None]).softmax(-1)
        # top-p: keep the smallest prefix of sorted tokens whose mass reaches top_p (always >= 1 token)
        sorted_probs, order = probs.sort(-1, descending=True)
        drop_sorted = sorted_probs.cumsum(-1) - sorted_probs >= self.top_p[:, None]
        probs = probs.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), 0.0)
        chosen = torch.empty(B, dtype=torch.long, device=scores.device)
        for i in range(B):
            if self.finish[i] is not None or greedy[i]:
                chosen[i] = probs[i].argmax()
            else:
                chosen[i] = torch.multinomial(probs[i], 1, generator=self.generators[i])[0]
        for i, token in enumerate(chosen.tolist()):
            if self.finish[i] is not None:
                continue
            self.tokens[i].append(token)
            self.logprobs[i].append(logp[i, token].item())
            if token in self.stop_ids[i]:
                self.finish[i] = "stop"
            elif len(self.tokens[i]) >= self.requests[i].max_new_tokens:
                self.finish[i] = "length"
        # greedy decoding over this one-hot picks exactly the sampled tokens
        return torch.full_like(scores, float("-inf")).scatter_(-1, chosen[:, None], 0.0)

    def _penalise_repeats(self, scores: torch.Tensor) -> torch.Tensor:
        """CTRL's repetition penalty, row by row, on the tokens of the row's prompt and completion so far:
        their logits / p when positive, * p when negative (as vLLM and transformers define it)."""
        if bool((self.penalty == 1).all()):
            return scores
        seen = torch.zeros_like(scores, dtype=torch.bool)
        for i, r in enumerate(self.requests):
            seen[i, list(r.prompt_ids) + self.tokens[i]] = True
        p = self.penalty[:, None]
        penalised = torch.where(scores > 0, scores / p, scores * p)
        return torch.where(seen, penalised, scores)

    def _hold_stops(self, scores: torch.Tensor) -> torch.Tensor:
        """Rows still short of their ``min_new_tokens`` cannot pick a stop token (logp stays the raw one)."""
        short = [i for i, r in enumerate(self.requests) if len(self.tokens[i]) < r.min_new_tokens]
        if not short:
            return scores
        scores = scores.clone()
        for i in short:
            scores[i, list(self.stop_ids[i])] = float("-inf")
        return scores

    def done(self, device: torch.device) -> torch.Tensor:
        return torch.tensor([f is not None for f in self.finish], device=device)


class _SampleProcessor(LogitsProcessor):
    def __init__(self, sampler: _RowSampler):
        self.sampler = sampler

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self.sampler.sample(scores)


class _RowStop(StoppingCriteria):
    def __init__(self, sampler: _RowSampler):
        self.sampler = sampler

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return self.sampler.done(input_ids.device)


class HFEngine(Engine):
    """Rollouts with transformers ``generate``; the model lives in this process on ``device``."""

    name = "hf"

    def __init__(self, model_path: Path | str, *, dtype: str = "float32", device: str = "cpu") -> None:
        """``dtype``: float32 (the trainer's), bfloat16, float16 or auto; ``device``: a torch device."""
        super().__init__(model_path)
        if not is_checkpoint(self.model_path):
            raise ModelNotFound(
                f"hf engine: no model checkpoint (config.json + *.safetensors) in {self.model_path}"
            )
        if dtype == "auto":  # the checkpoint's own dtype, as vLLM reads it
            config = json.loads((self.model_path / "config.json").read_text())
            dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise EngineError(f"hf engine: unknown dtype {dtype!r}; use float32, bfloat16, float16 or auto")
        if dtype == "bfloat16" and not native_bf16():
            log.warning(
                "hf engine in bfloat16 on hardware without native bf16 (emulated: 2-4x slower than float32 "
                "on an AVX2 CPU); rollout.dtype = native would take float32 here"
            )
        self.device = torch.device(device)
        self.tokenizer = load_tokenizer(self.model_path)
        self.model = load_causal_lm(self.model_path, dtype=dtype).to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self.eos_token_ids = set(eos) | {self.tokenizer.eos_token_id}
        self.pad_token_id = self.tokenizer.pad_token_id

    @torch.no_grad()
    def _generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        if any(r.json_schema is not None for r in requests):
            raise EngineError("hf engine: structured output (json_schema) needs the vllm engine")
        B, T = len(requests), max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(B, T, dtype=torch.long)
        for i, r in enumerate(requests):  # left padding: every prompt ends at column T - 1
            input_ids[i, T - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attention_mask[i, T - len(r.prompt_ids) :] = 1
        sampler = _RowSampler(requests, self.eos_token_ids, self.device)
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(r.max_new_tokens for r in requests),
            pad_token_id=self.pad_token_id,
            eos_token_id=None,  # stopping is per row, in _RowStop
        )
        self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            generation_config=config,
            logits_processor=LogitsProcessorList([_SampleProcessor(sampler)]),
            stopping_criteria=StoppingCriteriaList([_RowStop(sampler)]),
        )
        return [
            Generation(
                token_ids=tokens,
                logprobs=logprobs,
                finish_reason=finish,
                text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            )
            for tokens, logprobs, finish in zip(sampler.tokens, sampler.logprobs, sampler.finish, strict=True)
        ]

    @torch.no_grad()
    def _score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        logprobs = sequence_logprobs(self.model, prompts, completions)
        return [lp.tolist() for lp in logprobs]

    @torch.no_grad()
    def _reset_cache(self) -> None:
        pass  # generate keeps nothing between calls

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(dict(state_dict), strict=False)
        # a tied output layer may be left out of the state dict: it follows the embeddings
        tied = self.model.config.get_text_config().tie_word_embeddings
        missing = [k for k in missing if not (tied and k == "lm_head.weight")]
        if missing or unexpected:
            raise EngineError(
                f"hf engine: the new weights do not fit {self.model_path.name} "
                f"(missing: {missing[:5]}, unexpected: {list(unexpected)[:5]})"
            )

    def _close(self) -> None:
        del self.model
