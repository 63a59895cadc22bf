"""Does a bank import slow the training run beside it? (issue 49, point 3: goal ≤ 25 %)

A grpo run of the cpu preset with small steps (2 tasks × 2 rollouts, no evaluation) trains in a subprocess at
a training process's CPU priority (``STUDIO_TRAINING_NICE``), as the training worker starts it. In blocks of
``--block-steps`` steps the box alternately holds nothing else and an import loop: a subprocess at the light
worker's priority (``STUDIO_LIGHT_WORK_NICE``) importing ``--lines`` lines without vectors through
``experience.services.experience_import`` (validate, embed, stage, write: a worker's path) again and again, on
a database of its own (``bench_import_training``). A block's first step is not counted (it began in the other
kind of block). Printed: the median step time (``time/step_s``) without and with the import, their ratio, and
the import's lines/s beside training.

    .venv/bin/python benchmarks/bench_import_beside_training.py                    # 3 blocks of each kind
    .venv/bin/python benchmarks/bench_import_beside_training.py --blocks 1 --block-steps 2   # a quick look
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.bench_import_speed import make_lines  # noqa: E402
from benchmarks.outputs import write_output  # noqa: E402
from benchmarks.throwaway_db import throwaway_database  # noqa: E402

DB_NAME = "bench_import_training"
SMALL_STEPS = ["tasks_per_step=2", "k_rollouts=2", "eval_every=0"]


def importer(lines: int) -> None:
    """The import loop (``--importer``): import fresh lines until stopped; prints each import's seconds."""
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User

    from experience.services import experience_import
    from webapp.models import Run

    os.nice(settings.STUDIO_LIGHT_WORK_NICE)
    user = User.objects.get(username="bench")
    run = Run.objects.get(name="bench import beside training")
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    round_ = 0
    while not stop["now"]:
        source = io.StringIO(
            "".join(json.dumps(line) + "\n" for line in make_lines(lines, seed=1000 + round_))
        )
        began = time.perf_counter()
        experience_import(run, source, user=user, file_name="bench.jsonl")
        print(json.dumps({"lines": lines, "s": time.perf_counter() - began}), flush=True)
        round_ += 1


def start_training(folder: Path, nice: int) -> subprocess.Popen:
    out = folder / "run"
    overrides = [arg for kv in SMALL_STEPS for arg in ("--set", kv)]
    command = [sys.executable, "-m", "trainer.train", "--config", "cpu", "--method", "grpo",
               "--steps", "10000", "--out", str(out), *overrides]  # fmt: skip
    log = (folder / "train.log").open("w")
    return subprocess.Popen(
        command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(nice)
    )


def steps(folder: Path) -> list[dict]:
    path = folder / "run" / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "step"]


def wait_steps(folder: Path, training: subprocess.Popen, n: int, timeout: float = 3600) -> list[dict]:
    """Until the run has recorded ``n`` more steps; returns them."""
    have = len(steps(folder))
    deadline = time.monotonic() + timeout
    while len(steps(folder)) < have + n:
        if training.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the training run stopped: " + (folder / "train.log").read_text()[-2000:])
        time.sleep(1)
    return steps(folder)[have : have + n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=3, help="blocks of each kind, alternated")
    parser.add_argument("--block-steps", type=int, default=4, help="steps a block; the first is not counted")
    parser.add_argument("--lines", type=int, default=1000, help="lines an import of the loop holds")
    parser.add_argument("--importer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.importer:
        return importer(args.lines)

    with throwaway_database(DB_NAME), tempfile.TemporaryDirectory() as tmp:
        from django.conf import settings
        from django.contrib.auth.models import User

        from webapp.models import Run

        user = User.objects.create_user("bench")
        Run.objects.create(
            name="bench import beside training", owner=user, method="grpo", env="MiniHack-Room-5x5"
        )
        folder = Path(tmp)
        training = start_training(folder, settings.STUDIO_TRAINING_NICE)
        child_env = os.environ | {"STUDIO_DB_NAME": DB_NAME}
        quiet, busy, imports = [], [], []
        try:
            wait_steps(folder, training, 1)  # past its first step: models loaded, engine warm
            for block in range(args.blocks):
                quiet += wait_steps(folder, training, args.block_steps)[1:]
                log = folder / f"import-{block}.log"
                command = [sys.executable, __file__, "--importer", "--lines", str(args.lines)]
                loop = subprocess.Popen(
                    command, cwd=REPO, env=child_env, stdout=log.open("w"), stderr=subprocess.STDOUT
                )
                try:
                    busy += wait_steps(folder, training, args.block_steps)[1:]
                finally:
                    loop.terminate()
                    loop.wait(timeout=600)
                imports += [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
                print(f"block {block + 1}: without {[round(r['time/step_s'], 1) for r in quiet]}, "
                      f"with {[round(r['time/step_s'], 1) for r in busy]}", flush=True)  # fmt: skip
        finally:
            training.terminate()
            training.wait(timeout=120)

    without = statistics.median(r["time/step_s"] for r in quiet)
    beside = statistics.median(r["time/step_s"] for r in busy)
    figures = {
        "training": "grpo, cpu preset, 2 tasks × 2 rollouts a step",
        "nice of training / import": f"+{settings.STUDIO_TRAINING_NICE} / +{settings.STUDIO_LIGHT_WORK_NICE}",
        "steps counted without / with": f"{len(quiet)} / {len(busy)}",
        "step s without the import (median)": round(without, 1),
        "step s with the import (median)": round(beside, 1),
        "with / without": round(beside / without, 2),
        "imports finished beside training": len(imports),
        "import lines/s beside training (median)": (
            round(statistics.median(i["lines"] / i["s"] for i in imports), 1) if imports else None
        ),
        "step s without": [round(r["time/step_s"], 1) for r in quiet],
        "step s with": [round(r["time/step_s"], 1) for r in busy],
    }
    print(json.dumps(figures, indent=1))
    write_output("import-beside-training", figures)


if __name__ == "__main__":
    main()
