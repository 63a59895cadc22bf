"""Rollout throughput: generated tokens/s of the vLLM and transformers engines on the same batches.

    python -m benchmarks.bench_engines [--batch-sizes 8,32] [--new-tokens 32] [--repeats 3] [--dtype float32]

Each engine is built, warmed up, timed on every batch size (median of ``--repeats`` runs), then
closed before the next one starts. Sampling at temperature 1 with per-request seeds and log-probs,
as in training. Prints a table with the vLLM/HF ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # also runnable as a plain script

from benchmarks.outputs import write_output  # noqa: E402
from trainer.models import default_model_path, load_tokenizer, prepare_default_models  # noqa: E402
from trainer.rollout import GenerationRequest, make_engine  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for a tidy desk.",
    "Explain what a prime number is.",
    "Write a haiku about rain.",
    "How do I boil an egg?",
    "Name two planets and one fact about each.",
    "What does a compiler do?",
    "Suggest a name for a grey cat.",
]


def make_requests(tokenizer, batch_size: int, new_tokens: int, seed: int) -> list[GenerationRequest]:
    requests = []
    for i in range(batch_size):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        requests.append(GenerationRequest(prompt, max_new_tokens=new_tokens, temperature=1.0, seed=seed + i))
    return requests


def measure(engine, requests: list[GenerationRequest]) -> tuple[float, int]:
    """Wall seconds and generated tokens of one batched generate call."""
    start = time.perf_counter()
    generations = engine.generate(requests)
    return time.perf_counter() - start, sum(len(g.token_ids) for g in generations)


def bench_engine(name: str, model_path: Path, args, tokenizer) -> dict:
    start = time.perf_counter()
    engine = make_engine(name, model_path, dtype=args.dtype)
    startup = time.perf_counter() - start
    results = {"startup_s": startup}
    try:
        measure(engine, make_requests(tokenizer, min(args.batch_sizes), args.new_tokens, seed=10_000))
        for batch_size in args.batch_sizes:
            rates = []
            for repeat in range(args.repeats):
                requests = make_requests(tokenizer, batch_size, args.new_tokens, seed=repeat * 1000)
                seconds, tokens = measure(engine, requests)
                rates.append(tokens / seconds)
            results[batch_size] = statistics.median(rates)
            runs = ", ".join(f"{r:.0f}" for r in rates)
            print(f"  {name:4s} batch {batch_size:3d}: runs {runs} tok/s", flush=True)
    finally:
        engine.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", default="8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--new-tokens", default=32, type=int)
    parser.add_argument("--repeats", default=3, type=int)
    parser.add_argument("--dtype", default="float32", help="float32 (the trainer's) or bfloat16")
    parser.add_argument("--engines", default="vllm,hf", type=lambda s: s.split(","))
    args = parser.parse_args(argv)

    model_path = prepare_default_models(default_model_path())
    tokenizer = load_tokenizer(model_path)
    print(f"SmolLM2-135M-Instruct, {args.dtype}, {args.new_tokens} new tokens, median of {args.repeats} runs")
    results = {name: bench_engine(name, model_path, args, tokenizer) for name in args.engines}

    names = list(results)
    header = f"{'batch':>5} | " + " | ".join(f"{n + ' tok/s':>11}" for n in names)
    if names == ["vllm", "hf"]:
        header += " | vllm/hf"
    print("\n" + header + "\n" + "-" * len(header))
    for batch_size in args.batch_sizes:
        row = f"{batch_size:>5} | " + " | ".join(f"{results[n][batch_size]:>11.1f}" for n in names)
        if names == ["vllm", "hf"]:
            row += f" | {results['vllm'][batch_size] / results['hf'][batch_size]:>6.2f}x"
        print(row)
    print("startup: " + ", ".join(f"{n} {results[n]['startup_s']:.1f} s" for n in names))
    rows = [{"batch": b} | {f"{n} tok/s": round(results[n][b], 1) for n in names} for b in args.batch_sizes]
    startup = {f"{n} startup s": round(results[n]["startup_s"], 1) for n in names}
    figures = {"dtype": args.dtype, "new tokens": args.new_tokens, "repeats": args.repeats, "rows": rows}
    if names == ["vllm", "hf"]:
        for row in rows:
            row["vllm/hf"] = round(row["vllm tok/s"] / row["hf tok/s"], 2)
    write_output(f"engines-{args.dtype}", figures | startup)


if __name__ == "__main__":
    main()
