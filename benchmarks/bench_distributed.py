"""The overhead of distribution, and how close the actor update comes to the machine's matmul peak (issue 36).

    python benchmarks/bench_distributed.py [--layers 4] [--hidden 256] [--repeat 5] [--rounds 3]

Times ``ActorUpdate.step`` (split GRPO, PPO-clip, AdamW, float32) on one synthetic batch of 16 episodes
(prompt and turns of random ids, engine log-probs = the model's own) for a random-initialised Llama built
from a config (no download): once as 1 process with 2 threads, once as 2 processes with 1 thread each
(``torchrun``, FSDP2 over gloo, ``trainer.parallel``), the same batch and seed. Each setting runs one
warm-up step, then ``--repeat`` timed steps; the median is printed. The update's FLOPs are counted as
6 · parameters · trained-forward tokens (forward and backward of every row), and set against a float32
matmul peak (the median of timed n×n matrix products) measured in the same process with the same threads:
the fraction says how close the update is to what this CPU can do. The two settings alternate for
``--rounds`` rounds, so a burst of other work on the machine falls on both; the overhead printed is the median
of the rounds' ratios, with every round's ratio and the load average beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build(layers: int, hidden: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    heads = {"num_attention_heads": max(hidden // 64, 1), "num_key_value_heads": max(hidden // 128, 1)}
    sizes = {"hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers}
    cfg = LlamaConfig(vocab_size=8192, max_position_embeddings=512, tie_word_embeddings=True, **sizes | heads)
    return LlamaForCausalLM(cfg).float()


def batch(model, vocab: int):
    """16 episodes (4 task instances x 4, half guided), ~200 ids each, rewards mixed within every half."""
    import torch

    from trainer.rollout.base import sequence_logprobs
    from trainer.rollout.runner import Episode, EpisodeSpec, Segment

    gen = torch.Generator().manual_seed(1)
    episodes = []
    for group in range(4):
        for k in range(4):
            ids = torch.randint(3, vocab, (200,), generator=gen).tolist()
            seg = Segment(prompt_ids=ids[:80], response_ids=ids[80:], mask=[1] * 120)
            with torch.no_grad():
                (lp,) = sequence_logprobs(model, [seg.prompt_ids], [seg.response_ids])
            seg.engine_logprobs = lp.tolist()
            reward = float((group + k) % 2)
            spec = EpisodeSpec("bench", seed=group, group=group, guided=k < 2)
            episodes.append(Episode(spec, "", "", None, [], [seg], reward, reward > 0, False, [0], 0.0))
    return episodes


def matmul_peak(n: int = 1024, repeat: int = 5) -> float:
    """Float32 FLOP/s of an n×n product on this process's threads (median of ``repeat``)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def worker(args) -> None:
    """One process of a setting: time the update; rank 0 writes the figures to ``args.result``."""
    import torch

    from trainer import parallel
    from trainer.actor import ActorUpdate
    from trainer.config import ActorConfig

    torch.set_num_threads(args.threads)
    placement = parallel.init_distributed("cpu")
    plain = build(args.layers, args.hidden)
    n_params = sum(p.numel() for p in plain.parameters())
    episodes = batch(plain, plain.config.vocab_size)
    model = parallel.parallelize(plain, placement)
    update = ActorUpdate(model, ActorConfig(lr=1e-6, micro_batch_size=4), estimator="grpo_split")
    tokens = sum(s.num_ids for e in episodes for s in e.segments)
    update.step(episodes)  # warm-up
    times = []
    for _ in range(args.repeat):
        parallel.barrier()
        t0 = time.perf_counter()
        update.step(episodes)
        times.append(time.perf_counter() - t0)
    peak = matmul_peak()
    peaks = parallel.all_sum([peak], model)[0]  # the group's peak: every process's own
    if placement.rank == 0:
        step_s = statistics.median(times)
        result = {"step_s": step_s, "flops": 6 * n_params * tokens / step_s, "peak": peaks,
                  "params": n_params, "tokens": tokens, "world": placement.world_size}  # fmt: skip
        Path(args.result).write_text(json.dumps(result))
    parallel.barrier()
    parallel.destroy()


def run_setting(args, nproc: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        launcher = [sys.executable]
        if nproc > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        more = ["--layers", str(args.layers), "--hidden", str(args.hidden), "--repeat", str(args.repeat)]
        command = [*launcher, __file__, "--worker", "--threads", str(threads), "--result", str(result), *more]
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
        subprocess.run(command, env=env, check=True, capture_output=True)
        return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two settings")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    rounds = [(run_setting(args, nproc=1, threads=2), run_setting(args, nproc=2, threads=1))
              for _ in range(args.rounds)]  # fmt: skip
    ratios = [two["step_s"] / one["step_s"] for one, two in rounds]
    one, two = rounds[ratios.index(statistics.median_low(ratios))]
    size = f"{args.layers} layers x {args.hidden} ({one['params'] / 1e6:.1f}M params)"
    print(f"actor update, random Llama {size}, {one['tokens']} ids a batch, median of {args.repeat} steps")
    print(f"{'setting (median round)':<26}{'step s':>9}{'GFLOP/s':>10}{'matmul peak':>13}{'of peak':>9}")
    for name, r in (("1 process x 2 threads", one), ("2 processes x 1 thread", two)):
        line = f"{name:<26}{r['step_s']:>9.3f}{r['flops'] / 1e9:>10.2f}{r['peak'] / 1e9:>13.2f}"
        print(line + f"{r['flops'] / r['peak']:>9.1%}")
    each = ", ".join(f"{r:.2f}x" for r in ratios)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"distribution overhead (2 x 1 / 1 x 2 step time): {statistics.median(ratios):.2f}x median of "
        f"{args.rounds} rounds ({each}); load average {load}"
    )


if __name__ == "__main__":
    main()
