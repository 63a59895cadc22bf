"""Does a bank import slow the training run beside it? (issue 49, point 3: goal ≤ 25 %)

A grpo run of the cpu preset with small steps (2 tasks × 2 rollouts, no evaluation) trains in a subprocess at
a training process's CPU priority (``STUDIO_TRAINING_NICE``), as the training worker starts it. In blocks of
``--block-steps`` steps the box holds, in turn, nothing else and an import loop for each ``--import-nice``: a
subprocess at the light worker's priority (``STUDIO_LIGHT_WORK_NICE``) running the import task's work
(``experience.services.import_job_run``: validate, embed at ``STUDIO_IMPORT_NICE``, stage, write) on a file of
``--lines`` lines without vectors, again and again, on a database of its own (``bench_import_training``). A
block's first step is not counted (it began in the block before). Printed: the median step time
(``time/step_s``) without an import and with each, their ratios, and the import's lines/s beside training.

    .venv/bin/python benchmarks/bench_import_beside_training.py --import-nice 5 15   # before (the light
                                                           # worker's +5) and now, 2 rounds of 3 blocks
    .venv/bin/python benchmarks/bench_import_beside_training.py --rounds 1 --block-steps 2   # a quick look
"""

from __future__ import annotations

import argparse
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


def importer(lines: int, nice: int) -> None:
    """The import loop (``--importer``): the import task's work on fresh lines until stopped; prints each
    import's seconds."""
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User

    from experience.models import ImportJob
    from experience.services import import_job_run
    from webapp.models import Run

    os.nice(settings.STUDIO_LIGHT_WORK_NICE)
    settings.STUDIO_IMPORT_NICE = nice
    user = User.objects.get(username="bench")
    run = Run.objects.get(name="bench import beside training")
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    round_ = 0
    with tempfile.TemporaryDirectory() as tmp:
        while not stop["now"]:
            path = Path(tmp) / f"import-{round_}.jsonl"
            path.write_text(
                "".join(json.dumps(line) + "\n" for line in make_lines(lines, seed=1000 + round_))
            )
            job = ImportJob.objects.create(run=run, user=user, path=str(path), file_name=path.name)
            began = time.perf_counter()
            status = import_job_run(job.pk)
            print(
                json.dumps({"lines": lines, "s": time.perf_counter() - began, "status": status}), flush=True
            )
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


def _seconds(rows: list[dict]) -> list[float]:
    return [round(r["time/step_s"], 1) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of blocks: none, then each nice")
    parser.add_argument("--import-nice", type=int, nargs="+", help="import priorities [STUDIO_IMPORT_NICE]")
    parser.add_argument("--block-steps", type=int, default=4, help="steps a block; the first is not counted")
    parser.add_argument("--lines", type=int, default=1000, help="lines an import of the loop holds")
    parser.add_argument("--importer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.importer:
        return importer(args.lines, args.import_nice[0])

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
        nices = args.import_nice or [settings.STUDIO_IMPORT_NICE]
        quiet: list[dict] = []
        beside: dict[int, list[dict]] = {n: [] for n in nices}
        imports: dict[int, list[dict]] = {n: [] for n in nices}
        try:
            wait_steps(folder, training, 1)  # past its first step: models loaded, engine warm
            for r in range(args.rounds):
                quiet += wait_steps(folder, training, args.block_steps)[1:]
                for nice in nices:
                    log = folder / f"import-{r}-{nice}.log"
                    command = [sys.executable, __file__, "--importer", "--lines", str(args.lines),
                               "--import-nice", str(nice)]  # fmt: skip
                    loop = subprocess.Popen(command, cwd=REPO, env=child_env, stdout=log.open("w"),
                                            stderr=subprocess.STDOUT)  # fmt: skip
                    try:
                        beside[nice] += wait_steps(folder, training, args.block_steps)[1:]
                    finally:
                        loop.terminate()
                        loop.wait(timeout=600)
                    imports[nice] += [
                        json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")
                    ]
                withs = ", ".join(f"import at +{n}: {_seconds(beside[n])}" for n in nices)
                print(f"round {r + 1}: without {_seconds(quiet)}, {withs}", flush=True)
        finally:
            training.terminate()
            training.wait(timeout=120)

    without = statistics.median(r["time/step_s"] for r in quiet)
    figures = {
        "training": "grpo, cpu preset, 2 tasks × 2 rollouts a step",
        "nice of training / light worker": (
            f"+{settings.STUDIO_TRAINING_NICE} / +{settings.STUDIO_LIGHT_WORK_NICE}"
        ),
        "step s without an import (median)": round(without, 1),
        "steps counted without": len(quiet),
    }
    for nice in nices:
        with_import = statistics.median(r["time/step_s"] for r in beside[nice])
        done = [i for i in imports[nice] if i["status"] == "succeeded"]
        figures |= {
            f"step s with an import at +{nice} (median)": round(with_import, 1),
            f"with / without, import at +{nice}": round(with_import / without, 2),
            f"imports finished at +{nice}": len(done),
            f"import lines/s at +{nice} (median)": (
                round(statistics.median(i["lines"] / i["s"] for i in done), 1) if done else None
            ),
            f"step s with an import at +{nice}": _seconds(beside[nice]),
        }
    figures["step s without"] = _seconds(quiet)
    print(json.dumps(figures, indent=1))
    write_output("import-beside-training", figures)


if __name__ == "__main__":
    main()
