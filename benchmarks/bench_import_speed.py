"""How fast does a bank import go against the embedder it waits on? (issue 49, point 3)

Both on the same lines, in one process, on a database of its own (``bench_import_speed``):

- **encode**: the embedding model's own batched ``encode`` of the lines' texts (what an import cannot beat);
- **import**: ``experience.services.experience_import`` of the same lines as a JSONL export without vectors
  (validate, embed in batches, stage, write to the bank in one transaction): the path a worker runs.

Each round makes fresh lines and runs both, alternating which goes first; the figures are medians over the
rounds and the ratio import / encode. ``--beside-training`` runs the rounds while a grpo run trains in a
subprocess (``python -m trainer.train --config cpu``), started first and stopped afterwards.

    .venv/bin/python benchmarks/bench_import_speed.py                      # 3 rounds of 1,000 lines, idle
    .venv/bin/python benchmarks/bench_import_speed.py --beside-training    # the same beside a training run
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.outputs import write_output  # noqa: E402
from benchmarks.throwaway_db import throwaway_database  # noqa: E402

WORDS = "door key boulder stairs monster fountain potion wand ring corridor altar scroll east west".split()


def make_lines(n: int, seed: int) -> list[dict]:
    """``n`` export lines of a bank entry's usual size (a title and one or two sentences), all different."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        title = " ".join(rng.choices(WORDS, k=4)).capitalize() + f" ({seed}-{i})"
        content = " ".join(rng.choices(WORDS, k=rng.randint(12, 30))).capitalize() + "."
        lines.append({"format": "complementary-rl-experience/1", "scope": "MiniHack-Room-5x5", "title": title,
                      "content": content})  # fmt: skip
    return lines


def time_encode(embedder, lines: list[dict]) -> float:
    from experience import bank

    texts = [bank.entry_text(line["title"], line["content"]) for line in lines]
    began = time.perf_counter()
    options = {"batch_size": embedder.batch_size, "normalize_embeddings": True, "show_progress_bar": False}
    embedder.model.encode(texts, **options)
    return time.perf_counter() - began


def time_import(run, user, lines: list[dict]) -> float:
    from experience.models import Experience
    from experience.services import experience_import

    source = io.StringIO("".join(json.dumps(line) + "\n" for line in lines))
    before = Experience.objects.in_bank(run.pk).count()
    began = time.perf_counter()
    added = experience_import(run, source, user=user, file_name="bench.jsonl")
    took = time.perf_counter() - began
    assert added == len(lines) and Experience.objects.in_bank(run.pk).count() == before + len(lines)
    return took


def start_training(folder: Path, *, overrides: Sequence[str] = (), nice: int = 0) -> subprocess.Popen:
    """A grpo run of the cpu preset on this repository's default model (``--set`` each of ``overrides``), in a
    subprocess ``nice`` below this one; returns once it is past its first evaluation or step (its first
    metrics row), so that what follows runs beside its rollouts."""
    out = folder / "run"
    flags = [arg for kv in overrides for arg in ("--set", kv)]
    command = [sys.executable, "-m", "trainer.train", "--config", "cpu", "--method", "grpo",
               "--steps", "10000", "--out", str(out), *flags]  # fmt: skip
    log = (folder / "train.log").open("w")
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(nice)
    )
    deadline = time.monotonic() + 1800
    while not (out / "metrics.jsonl").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (folder / "train.log").read_text()[-2000:]
            raise RuntimeError(f"the training run did not start: {tail}")
        time.sleep(2)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beside-training", action="store_true")
    args = parser.parse_args()

    with throwaway_database("bench_import_speed"), tempfile.TemporaryDirectory() as tmp:
        from django.contrib.auth.models import User

        from experience.embedding import default_embedder
        from webapp.models import Run

        user = User.objects.create_user("bench")
        run = Run.objects.create(name="bench import", owner=user, method="grpo", env="MiniHack-Room-5x5")
        embedder = default_embedder()
        time_encode(embedder, make_lines(64, seed=-1))  # the model loaded and warm
        training = start_training(Path(tmp)) if args.beside_training else None
        encode_s, import_s = [], []
        try:
            for r in range(args.rounds):
                lines = make_lines(args.lines, seed=r)
                encode = lambda lines=lines: encode_s.append(time_encode(embedder, lines))  # noqa: E731
                imports = lambda lines=lines: import_s.append(time_import(run, user, lines))  # noqa: E731
                for timed in (encode, imports) if r % 2 == 0 else (imports, encode):
                    timed()
                print(f"round {r + 1}: encode {encode_s[-1]:.1f} s, import {import_s[-1]:.1f} s", flush=True)
        finally:
            if training is not None:
                training.terminate()
                training.wait(timeout=120)

    encode_rate = args.lines / statistics.median(encode_s)
    import_rate = args.lines / statistics.median(import_s)
    figures = {
        "situation": "beside a grpo training run" if args.beside_training else "idle",
        "lines per round": args.lines,
        "rounds": args.rounds,
        "encode lines/s (median)": round(encode_rate, 1),
        "import lines/s (median)": round(import_rate, 1),
        "import / encode": round(import_rate / encode_rate, 2),
        "encode s per round": [round(s, 2) for s in encode_s],
        "import s per round": [round(s, 2) for s in import_s],
    }
    print(json.dumps(figures, indent=1))
    write_output("import-speed-training" if args.beside_training else "import-speed-idle", figures)


if __name__ == "__main__":
    main()
