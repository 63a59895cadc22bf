"""Does a bank import slow the training run beside it? (issue 49, point 3: goal ≤ 25 %)

A grpo run of the cpu preset with small steps (2 tasks × 2 rollouts, no evaluation) trains in a subprocess at
a training process's CPU priority (``STUDIO_TRAINING_NICE``), as the training worker starts it. In blocks of
``--block-steps`` steps the box holds, in turn, nothing else and an import loop for each ``--import-at``: a
subprocess at the light worker's priority (``STUDIO_LIGHT_WORK_NICE``) running the import task's work
(``experience.services.import_job_run``: validate, embed at that priority, stage, write) on a file of
``--lines`` lines without vectors, again and again, on a database of its own (``bench_import_training``). A
block's first step is not counted (it began in the block before). Printed: the median step time
(``time/step_s``) without an import and with each, their ratios, and the import's lines/s beside training.
A priority is a nice value, ``15``; one under ``SCHED_IDLE`` too, ``15-idle``; or one that embeds at most a
share of the wall time while the cores are busy, ``19-share50`` (the product's: ``STUDIO_IMPORT_NICE``,
``STUDIO_IMPORT_IDLE``, ``STUDIO_IMPORT_SHARE``). The output is ``import-beside-training``, or
``import-beside-training-at-<priorities>`` for others.

    .venv/bin/python benchmarks/bench_import_beside_training.py --rounds 3 --block-steps 3  # the product's
    .venv/bin/python benchmarks/bench_import_beside_training.py --import-at 15-idle 19-share50 19
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
from benchmarks.bench_import_speed import make_lines, start_training  # noqa: E402
from benchmarks.outputs import write_output  # noqa: E402
from benchmarks.throwaway_db import throwaway_database  # noqa: E402

DB_NAME = "bench_import_training"
SMALL_STEPS = ["tasks_per_step=2", "k_rollouts=2", "eval_every=0"]


def importer(lines: int, at: str) -> None:
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
    nice, idle, share = _priority(at)
    settings.STUDIO_IMPORT_NICE, settings.STUDIO_IMPORT_IDLE, settings.STUDIO_IMPORT_SHARE = nice, idle, share
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


def _last_job_id() -> int:
    from experience.models import ImportJob

    return ImportJob.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _lines_embedded_since(job_id: int) -> int:
    """Lines the imports begun after ``job_id`` have embedded (``done`` while embedding, all once past it)."""
    from experience.models import ImportJob

    total = 0
    for job in ImportJob.objects.filter(id__gt=job_id):
        if job.status == ImportJob.Status.EMBEDDING:
            total += job.done
        elif job.status in (ImportJob.Status.WRITING, ImportJob.Status.SUCCEEDED):
            total += job.lines
    return total


def _stop(loop: subprocess.Popen) -> None:
    """Ask the import loop to stop after its import; kill it if that import does not end within a minute."""
    loop.terminate()
    try:
        loop.wait(timeout=60)
    except subprocess.TimeoutExpired:
        loop.kill()
        loop.wait()


def _priority(at: str) -> tuple[int, bool, float]:
    """``15`` / ``15-idle`` / ``19-share50``: (nice, under SCHED_IDLE, share of wall time while contended)."""
    nice, _, how = at.partition("-")
    share = int(how.removeprefix("share")) / 100 if how.startswith("share") else 1.0
    return int(nice), how == "idle", share


def _product_priority() -> str:
    from django.conf import settings

    if settings.STUDIO_IMPORT_IDLE:
        return f"{settings.STUDIO_IMPORT_NICE}-idle"
    share = round(settings.STUDIO_IMPORT_SHARE * 100)
    return f"{settings.STUDIO_IMPORT_NICE}" + (f"-share{share}" if share < 100 else "")


def _label(at: str) -> str:
    nice, idle, share = _priority(at)
    how = " and SCHED_IDLE" if idle else f", at most {share:.0%} of the time" if share < 1 else ""
    return f"+{nice}{how}"


def _seconds(rows: list[dict]) -> list[float]:
    return [round(r["time/step_s"], 1) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of blocks: none, then each priority")
    parser.add_argument(
        "--import-at", nargs="+", help="import priorities: 15, 15-idle, 19-share50 [the product's]"
    )
    parser.add_argument("--block-steps", type=int, default=4, help="steps a block; the first is not counted")
    parser.add_argument("--lines", type=int, default=1000, help="lines an import of the loop holds")
    parser.add_argument("--importer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.importer:
        return importer(args.lines, args.import_at[0])

    with throwaway_database(DB_NAME), tempfile.TemporaryDirectory() as tmp:
        from django.conf import settings
        from django.contrib.auth.models import User

        from webapp.models import Run

        user = User.objects.create_user("bench")
        Run.objects.create(
            name="bench import beside training", owner=user, method="grpo", env="MiniHack-Room-5x5"
        )
        folder = Path(tmp)
        training = start_training(folder, overrides=SMALL_STEPS, nice=settings.STUDIO_TRAINING_NICE)
        child_env = os.environ | {"STUDIO_DB_NAME": DB_NAME}
        product = [_product_priority()]
        nices = args.import_at or product
        quiet: list[dict] = []
        beside: dict[str, list[dict]] = {n: [] for n in nices}
        imports: dict[str, list[dict]] = {n: [] for n in nices}
        embedded: dict[str, tuple] = {n: () for n in nices}
        try:
            for r in range(args.rounds):
                quiet += wait_steps(folder, training, args.block_steps)[1:]
                for nice in nices:
                    log = folder / f"import-{r}-{nice}.log"
                    command = [sys.executable, __file__, "--importer", "--lines", str(args.lines),
                               "--import-at", nice]  # fmt: skip
                    loop = subprocess.Popen(command, cwd=REPO, env=child_env, stdout=log.open("w"),
                                            stderr=subprocess.STDOUT)  # fmt: skip
                    began, first_job = time.monotonic(), _last_job_id()
                    try:
                        beside[nice] += wait_steps(folder, training, args.block_steps)[1:]
                    finally:
                        embedded[nice] += (_lines_embedded_since(first_job), time.monotonic() - began)
                        _stop(loop)
                    imports[nice] += [
                        json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")
                    ]
                withs = ", ".join(f"import at {_label(n)}: {_seconds(beside[n])}" for n in nices)
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
            f"step s with an import at {_label(nice)} (median)": round(with_import, 1),
            f"with / without, import at {_label(nice)}": round(with_import / without, 2),
            f"imports finished at {_label(nice)}": len(done),
            f"lines embedded a second during the blocks at {_label(nice)}": round(
                sum(embedded[nice][0::2]) / sum(embedded[nice][1::2]), 1
            ),
            f"import lines/s at {_label(nice)} (median)": (
                round(statistics.median(i["lines"] / i["s"] for i in done), 1) if done else None
            ),
            f"step s with an import at {_label(nice)}": _seconds(beside[nice]),
        }
    figures["step s without"] = _seconds(quiet)
    print(json.dumps(figures, indent=1))
    write_output("import-beside-training" + ("" if nices == product else "-at-" + "-".join(nices)), figures)


if __name__ == "__main__":
    main()
