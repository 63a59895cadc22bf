"""A large import while the run's merge passes run: is every line in the bank once, and no merge change lost?
(issue 49, point 3)

On a database of its own (``bench_import_merge``): a run whose bank holds ``--own`` entries, served by a live
``ExperienceManager``; one thread imports a ``--lines``-line export through
``experience.services.experience_import`` (validate, stage, write in one transaction, the path a worker runs),
while another runs the manager's merge passes over the same scope, one after another, until the import has
ended. The merge function is a fixed rule, not πϕ (the LLM's answer is not what is measured here, the
bank's writes are): in each chunk it merges the first two entries, or rewrites the first, alternately. The
export carries its vectors (as exports do), so the import's time goes to validating, staging and writing
rather than to embedding, which ``bench_import_speed.py`` measures.

Checked afterwards: the job succeeded with every line; each imported line is in the bank exactly once, with
one ``import`` change; the run's own entries are exactly what replaying every applied merge record on the
starting bank gives; no chunk was refused as stale. Printed: the import's phases, the merge passes and
chunks, and the longest gap between two chunks of a pass while the import wrote its entries (a merge that
waited for the import's transaction would show it here).

    .venv/bin/python benchmarks/bench_import_merge.py                 # 100,000 lines, a bank of 1,000
    .venv/bin/python benchmarks/bench_import_merge.py --lines 5000    # a quick look
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.bench_import_speed import WORDS  # noqa: E402
from benchmarks.outputs import write_output  # noqa: E402
from benchmarks.throwaway_db import throwaway_database  # noqa: E402

SCOPE = "MiniHack-Room-5x5"
BASES = 256
"""Distinct texts embedded for the export; each line's vector is one of them, perturbed."""


def write_export(path: Path, n: int, embedder) -> None:
    """``n`` export lines titled ``Imported <i>``, each with a vector of the importer's model."""
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=12)) for _ in range(BASES)]
    bases = embedder.embed(texts, cache=False)
    with path.open("w") as out:
        for i in range(n):
            v = bases[i % BASES] + rng.normal(0, 0.05, embedder.dim)
            v = v / np.linalg.norm(v)
            line = {"format": "complementary-rl-experience/1", "scope": SCOPE, "title": f"Imported {i}",
                    "content": f"{texts[i % BASES]} (line {i}).", "embedding_model": embedder.model_id,
                    "embedding": [round(float(x), 5) for x in v]}  # fmt: skip
            out.write(json.dumps(line) + "\n")


def merge_rule(passes: list[int]):
    """A merge function: merge the first two entries of a chunk, or rewrite the first, alternately."""
    from trainer.store import MergeAction, MergePlan

    calls = {"n": 0}

    def plan(chunk):
        calls["n"] += 1
        first = chunk[0]
        if calls["n"] % 2 and len(chunk) >= 2:
            second = chunk[1]
            action = MergeAction("merge", (first.id, second.id), f"Merged {first.id}+{second.id}",
                                 f"{first.content[:200]} {second.content[:200]}")  # fmt: skip
        else:
            action = MergeAction("rewrite", (first.id,), f"Rewritten {first.id} (pass {passes[0]})",
                                 first.content[:400])  # fmt: skip
        return MergePlan((action,))

    return plan


def replay(own: set[int], run_id: int) -> set[int]:
    """The run's own live entries that the applied merge records imply, starting from ``own``."""
    from experience.models import ExperienceChange, Merge

    live = set(own)
    for merge in Merge.objects.filter(run_id=run_id, decision=Merge.Decision.CHANGED).order_by("id"):
        for change in merge.changes.order_by("id"):
            if change.kind == ExperienceChange.Kind.MERGE_REMOVE:
                live.remove(change.experience_id)
            elif change.kind == ExperienceChange.Kind.MERGE_ADD:
                live.add(change.experience_id)
    return live


def chunk_gaps(times: list[float], writing: tuple[float, float] | None) -> dict:
    """Gaps between consecutive merge chunks (wall clock): median and longest, and the longest of those that
    overlap the import's write phase ``writing`` (start, end), with how many chunks fell inside it."""
    pairs = list(itertools.pairwise(times))
    gaps = [b - a for a, b in pairs]
    inside = [b - a for a, b in pairs if writing and b > writing[0] and a < writing[1]]
    return {
        "p50": round(statistics.median(gaps), 3) if gaps else None,
        "max": round(max(gaps), 2) if gaps else None,
        "max_writing": round(max(inside), 2) if inside else None,
        "during": sum(writing[0] <= t <= writing[1] for t in times) if writing else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--own", type=int, default=1000, help="entries of the run's own bank")
    args = parser.parse_args()

    with throwaway_database("bench_import_merge"), tempfile.TemporaryDirectory() as tmp:
        from django.contrib.auth.models import User
        from django.db import connection

        from experience.embedding import default_embedder
        from experience.manager import ExperienceManager
        from experience.models import Experience, ExperienceChange, ImportJob, Merge
        from experience.services import experience_import
        from trainer.store import Add
        from webapp.models import Run

        user = User.objects.create_user("bench")
        run = Run.objects.create(name="bench import merge", owner=user, method="complementary", env=SCOPE)
        embedder = default_embedder()
        export = Path(tmp) / "export.jsonl"
        began = time.perf_counter()
        write_export(export, args.lines, embedder)
        print(f"export of {args.lines:,} lines ({export.stat().st_size / 1e6:.0f} MB) "
              f"in {time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip

        with ExperienceManager(run.pk, embedder=embedder, capacity=10 * (args.lines + args.own)) as manager:
            own = manager.apply([Add(SCOPE, f"Own {i}", f"Own lesson {i}: {' '.join(WORDS[: 3 + i % 9])}.")
                                 for i in range(args.own)], step=0)  # fmt: skip
            own_ids = {r.entry_id for r in own}
            done = threading.Event()
            outcome: dict = {}
            imported_at: dict[str, float] = {}

            def importing() -> None:
                try:
                    with export.open() as source:
                        outcome["entries"] = experience_import(run, source, user=user, file_name="big.jsonl")
                except BaseException as err:  # noqa: BLE001 - reported below
                    outcome["error"] = repr(err)
                finally:
                    imported_at["end"] = time.time()
                    done.set()
                    connection.close()

            passes, chunk_times, reports = [0], [], []
            plan = merge_rule(passes)

            def timed(chunk):
                chunk_times.append(time.time())
                return plan(chunk)

            start = time.time()
            importer = threading.Thread(target=importing)
            importer.start()
            while not done.is_set():
                passes[0] += 1
                reports.append(manager.merge(SCOPE, timed, step=passes[0]))
                r = reports[-1]
                print(f"pass {passes[0]}: {r.chunks} chunks, {r.created} created, {r.removed} removed, "
                      f"{r.rewritten} rewritten, {r.stale} stale", flush=True)  # fmt: skip
            importer.join()
        end = time.time()

        job = ImportJob.objects.get(run=run)
        imported = Experience.objects.in_bank(run.pk).filter(title__startswith="Imported ")
        titles = set(imported.values_list("title", flat=True))
        own_now = Experience.objects.in_bank(run.pk).exclude(title__startswith="Imported ")
        live_own, replayed = set(own_now.values_list("id", flat=True)), replay(own_ids, run.pk)
        merges = Merge.objects.filter(run=run)
        writing = (job.phase_started_at.timestamp(), job.finished_at.timestamp()) if job.finished_at else None
        gaps = chunk_gaps(chunk_times, writing)
        figures = {
            "lines imported": args.lines,
            "own entries at the start": args.own,
            "import outcome": outcome.get("error") or job.status,
            "import s": round(imported_at["end"] - start, 1),
            "imported entries in the bank": imported.count(),
            "distinct imported lines in the bank": len(titles),
            "import changes recorded": ExperienceChange.objects.filter(run=run, kind="import").count(),
            "every line once": imported.count() == len(titles) == args.lines,
            "import write phase s": round(writing[1] - writing[0], 1) if writing else None,
            "merge passes during the import": len(reports),
            "merge chunks applied": merges.filter(decision=Merge.Decision.CHANGED).count(),
            "merge chunks refused as stale": merges.filter(decision=Merge.Decision.STALE).count(),
            "own entries now / from replaying the merges": f"{len(live_own)} / {len(replayed)}",
            "no merge change lost": live_own == replayed,
            "chunks during the write phase": gaps["during"],
            "chunk gap p50 s (whole run)": gaps["p50"],
            "chunk gap max s (whole run)": gaps["max"],
            "chunk gap max s (write phase)": gaps["max_writing"],
            "wall s": round(end - start, 1),
        }
    print(json.dumps(figures, indent=1))
    write_output("import-merge", figures)


if __name__ == "__main__":
    main()
