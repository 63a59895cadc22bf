"""The launch plan (trainer.plan) against measured peaks: a few real steps of each config, one at a time.

    python benchmarks/bench_plan.py [--steps 2] [--only grpo,complementary,lora,fsdp2] [--set key=value ...]

Each config runs with ``--steps`` as ``python -m trainer.train`` (grpo) or ``manage.py train`` (the experience
methods need the bank's database: recorded as a run named bench_plan of the admin account, which ``make run``
creates with the database),
evaluating only at the end; a sampler reads the resident memory of the whole process tree (every torchrun
rank, every engine) every 0.2 s and keeps the peak. Printed per config: the plan's peak (one device; for
``fsdp2`` the sum over its ranks, as they share this machine) against the measured peak RSS, and the plan's
step time against the median ``time/step_s`` of the run's steps, and how many steps ran a backward pass
(``actor/sequences`` above 0: a step whose groups all have zero advantage trains nothing, so its peak is not
the plan's), and for the methods that train πϕ the most generations one of its CISPO updates trained on
(``extractor/trained_samples``; 0: πϕ's backward never ran, so its part of the plan was not exercised).
``--set`` changes every config alike, e.g. an env where SmolLM2 earns rewards: ``--set
env=MiniHack-Room-Random-5x5 --set rollout.max_new_tokens=8 --set rollout.temperature=0.7``. The acceptance
bound of issue 37: peak within ±25%, step time within ±50%. The figures land in
``docs/benchmarks/results/<--output>.json`` (``benchmarks.outputs``; default ``plan-measured``, or
``plan-near-limit`` when every config is a near one), which docs/launches.md's tables render.

Run it on a quiet machine: one config at a time, nothing else heavy beside it (a complementary cpu step
holds ~20 GB here). Timings under other load are not the plan's to match.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.outputs import write_output  # noqa: E402
from trainer.plan import Devices  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRPO = ["--config", "cpu", "--method", "grpo"]
COMPLEMENTARY = ["--config", "cpu", "--method", "complementary"]
NO_WARMUP = ["--set", "experience.warmup_steps=0"]
MEASURED = "grpo,complementary,lora,fsdp2"
CONFIGS = {
    "grpo": GRPO,
    "complementary": COMPLEMENTARY,
    "lora": [*GRPO, "--set", "actor.lora.rank=16"],
    "fsdp2": [*GRPO, "--nproc", "2"],
    # accepted launches close to this machine's memory by the plan (issue 37: none may die of memory)
    # (with the --set of docs/launches.md: 97%, 86% and 93% of this 25 GB box)
    "near-grpo": [*GRPO, "--set", "actor.micro_batch_size=6"],
    "near-fsdp2": [*GRPO, "--nproc", "2", "--set", "actor.micro_batch_size=2"],
    "near-complementary": [*COMPLEMENTARY, *NO_WARMUP, "--set", "actor.micro_batch_size=4"],
}


def tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_measured(argv: list[str], out: Path) -> tuple[int, int]:
    """Run ``manage.py train ARGV --out OUT``; returns (exit code, peak RSS of its process tree)."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    grpo = "grpo" in argv
    # the experience methods need their bank, so manage.py records them (as a run of the admin account)
    entry = ["-m", "trainer.train"] if grpo else [str(ROOT / "manage.py"), "train", "--name", "bench_plan"]
    cmd = [sys.executable, *entry, *argv, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode:
        print(err.decode(errors="replace")[-2000:], file=sys.stderr)
    return proc.returncode, peak[0]


def planned(argv: list[str], steps: int):
    from trainer.plan import plan_run
    from trainer.train import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*argv, "--steps", str(steps), "--set", "eval_every=0"])
    cfg = config_from_args(args)
    plan = plan_run(cfg, Devices.this_machine().shared_by(cfg.nproc))
    return plan, cfg.nproc


def metric_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def step_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("kind") == "step" and "time/step_s" in r]


def phases(rows: list[dict]) -> str:
    """The median of each phase's time and of the actor's trained tokens over the steps."""
    keys = {"rollout": "time/rollout_s", "backward": "time/backward_s", "sync": "time/sync_s"}
    out = [f"{name} {statistics.median(r.get(key, 0) for r in rows):.0f} s" for name, key in keys.items()]
    tokens = statistics.median(r.get("actor/tokens", 0) for r in rows)
    return ", ".join(out) + f", actor tokens trained {tokens:,.0f}"


def extractor_trained(rows: list[dict]) -> str:
    """The most generations one πϕ update trained on ('-' for a run that has no πϕ update)."""
    seen = [r["extractor/trained_samples"] for r in rows if "extractor/trained_samples" in r]
    return f"{max(seen):.0f}" if seen else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--only", default=MEASURED, help="comma-separated: " + ", ".join(CONFIGS))
    parser.add_argument("--set", action="append", default=[], help="key=value for every config (repeatable)")
    parser.add_argument("--keep", type=Path, help="copy each run's metrics.jsonl here as NAME.jsonl")
    parser.add_argument("--output", help="the output's name [plan-measured, or plan-near-limit]")
    args = parser.parse_args()
    near = all(name.startswith("near-") for name in args.only.split(","))
    output = args.output or ("plan-near-limit" if near else "plan-measured")
    figures = {"steps": args.steps, "set": args.set, "ram_gb": 0.0, "rows": []}
    more = [arg for setting in args.set for arg in ("--set", setting)]
    print(
        f"{'config':<14} {'plan GB':>8} {'peak GB':>8} {'ratio':>6} {'plan s':>7} {'step s':>7} {'ratio':>6}"
        f" {'backward':>9} {'πϕ trained':>10} {'plan/RAM':>9}"
    )
    ram = Devices.this_machine().memory
    figures["ram_gb"] = round(ram / 1e9, 1)
    for name in args.only.split(","):
        config = [*CONFIGS[name], *more]
        plan, nproc = planned(config, args.steps)
        want = plan.device_bytes() * nproc
        row = {"config": name, "settings": " ".join(CONFIGS[name]), "plan_peak_gb": round(want / 1e9, 1),
               "plan_step_s": round(plan.step_s), "plan_of_ram": f"{want / ram:.0%}"}  # fmt: skip
        figures["rows"].append(row)
        argv = [*config, "--steps", str(args.steps), "--set", "eval_every=0"]
        with tempfile.TemporaryDirectory(prefix=f"bench-plan-{name}-") as tmp:
            code, peak = run_measured(argv, Path(tmp))
            if code:
                died = " (SIGKILL: out of memory?)" if code == -9 else ""
                print(f"{name:<14} {want / 1e9:>8.1f} failed (exit {code}{died}); peak {peak / 1e9:.1f} GB")
                row |= {"exit": code, "measured_peak_gb": round(peak / 1e9, 1)}
                continue
            every = metric_rows(Path(tmp))
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(Path(tmp) / "metrics.jsonl", args.keep / f"{name}.jsonl")
        rows = step_rows(every)
        step = statistics.median(r["time/step_s"] for r in rows)
        trained = sum(r.get("actor/sequences", 0) > 0 for r in rows)
        print(
            f"{name:<14} {want / 1e9:>8.1f} {peak / 1e9:>8.1f} {want / peak:>6.2f} "
            f"{plan.step_s:>7.0f} {step:>7.0f} {plan.step_s / step:>6.2f} {trained:>4} of {len(rows)}"
            f" {extractor_trained(every):>10} {want / ram:>9.0%}"
        )
        print("  medians: " + phases(rows))
        row |= {"measured_peak_gb": round(peak / 1e9, 1), "measured_step_s": round(step),
                "steps_trained": f"{trained} of {len(rows)}", "extractor_trained": extractor_trained(every),
                "medians": phases(rows)}  # fmt: skip
    write_output(output, figures)


if __name__ == "__main__":
    main()
