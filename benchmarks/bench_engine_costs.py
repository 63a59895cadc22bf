"""What a vLLM engine holds beyond its weights and KV cache, and what a weight sync adds (trainer.plan).

    .venv/bin/python benchmarks/bench_engine_costs.py [--kv-gib 1.0] [--batches 16,32] [--prompt 1200]

One process, the prepared SmolLM2: resident memory (RSS) after importing torch, transformers and vLLM; after
starting the cpu preset's engine with a ``--kv-gib`` cache; after generating each batch of ``--prompt``
random ids + 48 new tokens; then after loading the trainer's float32 copy and handing its weights to the
engine (``update_weights``, as every step's sync does). Printed: each figure and the growth the plan has to
count besides the engine's weights and cache (``trainer.plan.VLLM_CPU_RUNTIME_BYTES``) and for a sync. Then
the rates ``trainer.plan`` turns into rollout time: prefill (each batch's new prompts, one token generated,
fresh ids so that no prefix is cached) and decode (``--decode`` tokens on top of that), both in tokens a
second over the batch, median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.outputs import write_output  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
GiB = 2**30


def rss() -> float:
    return psutil.Process().memory_info().rss / GiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-gib", type=float, default=1.0)
    parser.add_argument("--batches", default="16,32")
    parser.add_argument("--prompt", type=int, default=1200)
    parser.add_argument("--decode", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import vllm  # noqa: F401

    from trainer.assemble import build_engine
    from trainer.config import get_preset
    from trainer.models import load_causal_lm
    from trainer.plan import model_shape
    from trainer.rollout.base import GenerationRequest

    imported = rss()
    cfg = get_preset("cpu")
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, kv_cache_gib=args.kv_gib))
    weights = model_shape(cfg.actor.model_path).params() * 2 / GiB  # bf16 on this CPU (plan's engine_dtype)
    engine = build_engine(cfg)
    started = rss()
    rows = [("imports (torch, transformers, vllm)", imported), ("engine started", started)]
    rng = random.Random(0)
    for size in map(int, args.batches.split(",")):
        prompts = random_prompts(rng, size, args.prompt)
        engine.generate([GenerationRequest(p, max_new_tokens=48, seed=i) for i, p in enumerate(prompts)])
        rows.append((f"after {size} x {args.prompt}+48 generated", rss()))
    generated = rss()
    model = load_causal_lm(cfg.actor.model_path)
    loaded = rss()
    engine.update_weights(model.state_dict(), 1)
    synced = rss()
    rows += [("trainer's float32 model loaded", loaded), ("after a weight sync", synced)]
    for name, value in rows:
        print(f"{name:<40} {value:>6.2f} GiB")
    runtime = generated - imported - weights - args.kv_gib
    print(f"engine runtime beyond {weights:.2f} GiB weights + {args.kv_gib} GiB cache: {runtime:.2f} GiB "
          f"({started - imported - weights - args.kv_gib:.2f} at start)")  # fmt: skip
    float32 = sum(p.numel() * 4 for p in model.parameters()) / GiB  # tied weights once
    print(f"a sync's growth: {synced - loaded:+.2f} GiB (the model's float32 weights: {float32:.2f} GiB)")
    n, prompt, more = int(args.batches.split(",")[-1]), args.prompt, args.decode
    prefill = statistics.median(timed(engine, rng, n, prompt, 1) for _ in range(args.repeats))
    both = statistics.median(timed(engine, rng, n, prompt, more + 1) for _ in range(args.repeats))
    decode_s = max(both - prefill, 1e-9)
    print(f"prefill: {n * prompt / prefill:,.0f} tokens/s ({n} x {prompt} ids in {prefill:.1f} s)")
    print(f"decode:  {n * more / decode_s:,.0f} tokens/s ({n} x {more} more in {decode_s:.1f} s)")
    engine.close()
    figures = {f"RSS {name} GiB": round(value, 2) for name, value in rows}
    figures |= {"engine runtime beyond weights + cache GiB": round(runtime, 2),
                "engine runtime at start GiB": round(started - imported - weights - args.kv_gib, 2),
                "a sync's growth GiB": round(synced - loaded, 2), "float32 weights GiB": round(float32, 2),
                f"prefill tokens/s (batch {n})": round(n * prompt / prefill),
                f"decode tokens/s (batch {n})": round(n * more / decode_s)}  # fmt: skip
    write_output("engine-costs", figures)


def random_prompts(rng: random.Random, size: int, length: int) -> list[tuple[int, ...]]:
    """``size`` prompts of ``length`` random token ids (fresh each call, so no prefix is cached)."""
    return [tuple(rng.randrange(10, 40_000) for _ in range(length)) for _ in range(size)]


def timed(engine, rng: random.Random, size: int, prompt: int, new: int) -> float:
    """Seconds to answer ``size`` fresh prompts of ``prompt`` random ids with exactly ``new`` tokens each."""
    from trainer.rollout.base import GenerationRequest

    prompts = random_prompts(rng, size, prompt)
    requests = [
        GenerationRequest(p, max_new_tokens=new, min_new_tokens=new, seed=i) for i, p in enumerate(prompts)
    ]
    t0 = time.perf_counter()
    engine.generate(requests)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
