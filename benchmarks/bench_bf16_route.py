"""bf16 vLLM on a CPU without hardware bf16: the float32 GEMM route against vLLM's own (emulated) bf16 GEMMs.

    python benchmarks/bench_bf16_route.py [--prompts 16] [--repeats 2] [--new-tokens 8]

Three engines, each in its own process (vLLM's state is process-wide), on the same long prompts (~800
tokens, greedy, prefix caching off so that every repeat prefills): float32; bfloat16 with the route (what
``trainer.rollout.vllm`` does on such CPUs); bfloat16 through vLLM's dispatch (oneDNN's emulation). Prints the
median wall time of a batch, the ratio to float32, and how often greedy completions agree with vLLM's bf16.
On a CPU with native bf16 the route is not used by the engine, but this still measures it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.outputs import write_output  # noqa: E402

MODES = ("float32", "bfloat16-route", "bfloat16-vllm")
ENGINE_OPTIONS = {"kv_cache_memory_bytes": 3 << 30, "enable_prefix_caching": False}


def long_requests(tokenizer, prompts: int, new_tokens: int) -> list:
    """Greedy requests on ~800-token slices of the documentation (``docs/benchmarks.md``: long, and stable
    text for the tokenizer)."""
    from trainer.rollout import GenerationRequest

    text = (ROOT / "docs" / "benchmarks.md").read_text()
    requests = []
    for i in range(prompts):
        chat = [{"role": "user", "content": text[i * 300 : i * 300 + 2400] + "\nWhich direction?"}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
        requests.append(GenerationRequest(tuple(ids), max_new_tokens=new_tokens, temperature=0.0))
    return requests


def serve(mode: str, prompts: int, repeats: int, new_tokens: int) -> dict:
    """One engine in this process: the batch's wall times and greedy completions."""
    sys.path.insert(0, str(ROOT))
    from trainer.models import default_model_path, load_tokenizer, prepare_default_models
    from trainer.rollout import make_engine
    from trainer.rollout import vllm as vllm_engine

    if mode == "bfloat16-route":
        vllm_engine._route_bf16_gemms_through_float32()
    else:
        vllm_engine.native_bf16 = lambda: True  # keeps the route out of this engine
    path = prepare_default_models(default_model_path())
    requests = long_requests(load_tokenizer(path), prompts, new_tokens)
    dtype = "float32" if mode == "float32" else "bfloat16"
    times = []
    with make_engine("vllm", path, dtype=dtype, **ENGINE_OPTIONS) as engine:
        for _ in range(repeats):
            start = time.perf_counter()
            generations = engine.generate(requests)
            times.append(time.perf_counter() - start)
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    return {"times": times, "completions": [g.token_ids for g in generations], "prompt_tokens": prompt_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        print(json.dumps(serve(args.serve, args.prompts, args.repeats, args.new_tokens)))
        return
    results = {}
    for mode in MODES:
        command = [sys.executable, __file__, "--serve", mode, "--prompts", str(args.prompts),
                   "--repeats", str(args.repeats), "--new-tokens", str(args.new_tokens)]  # fmt: skip
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    reference = statistics.median(results["float32"]["times"])
    vllm_bf16 = results["bfloat16-vllm"]["completions"]
    tokens = results["float32"]["prompt_tokens"]
    print(f"{args.prompts} prompts, {tokens} prompt tokens, {args.new_tokens} new tokens each")
    print("| engine | median s | x float32 | completions equal to vLLM bf16's |\n|---|---|---|---|")
    rows = []
    for mode, result in results.items():
        median = statistics.median(result["times"])
        same = sum(a == b for a, b in zip(result["completions"], vllm_bf16, strict=True))
        print(f"| {mode} | {median:.1f} | {median / reference:.2f} | {same}/{args.prompts} |")
        rows.append({"engine": mode, "median s": round(median, 1), "x float32": round(median / reference, 2),
                     "completions equal to vLLM bf16's": f"{same}/{args.prompts}"})  # fmt: skip
    figures = {"prompts": args.prompts, "prompt tokens": tokens, "new tokens": args.new_tokens, "rows": rows}
    write_output("bf16-route", figures)


if __name__ == "__main__":
    main()
