"""Rollout time of experience-guided vs experience-free episodes at the same batch (target: ≤ 5% overhead).

    python benchmarks/bench_overhead.py [--tasks 2] [--k 8] [--repeat 5] [--entries 200]

Each round samples a training step's batch of MiniHack-Room-5x5 episodes and plays it with the SmolLM2
actor on vLLM, free and guided (same instances, same sampling seeds), ``--repeat`` rounds after one
warm-up round. Every batch starts with an empty prefix cache, as every training step does (the weight
sync resets it); otherwise a replayed batch would find its own earlier prompts cached. Guided episodes
retrieve the top-1 entry of a bank of ``--entries`` entries through the real ExperienceManager
(PostgreSQL + pgvector, MiniLM embeddings, micro-batching, diversification; a throwaway database) and
carry it in their system prompt, so the guided figure includes both costs of the machinery: the
retrieval and the longer prompts.

Guided and free episodes may take different paths and lengths, so besides the wall time of a batch the
benchmark compares the time per engine turn (one batched ``generate`` over the live episodes) and per
generated token, and reports the retrieval time on its own. Overhead = guided / free − 1 on medians.

A turn lasts as long as its longest completion (the batch decodes in lock-step), so a model that answers
at greater length under a longer prompt makes guided turns slower without any cost in the machinery. The
``fixed`` arms separate the two: every completion is held to exactly ``max_new_tokens`` tokens (EOS held
back, ``GenerationRequest.min_new_tokens``), so free and guided decode the same number of steps and
differ only in what the machinery adds: retrieval and the longer prompt. ``decode steps/turn`` is the
mean over turns of the longest completion in the batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

from throwaway_db import throwaway_database  # noqa: E402  (beside this script)

ENV = "MiniHack-Room-5x5"
LESSONS = [
    ("Walk to the stairs", "Find the > sign on the map and move towards it, one step per turn."),
    ("Avoid walls", "If a move does not change your position, a wall is in the way: try another direction."),
    (
        "Diagonals save turns",
        "When the stairs are up and to the right, move northeast rather than north then east.",
    ),
    (
        "Read the message line",
        "The message line tells you what happened; 'You can't move there' means a wall.",
    ),
    ("Count the distance", "Count rows and columns between @ and >, then move along the longer axis first."),
]


def seed_bank(store, n: int) -> None:
    from trainer.store import Add

    ops = [
        Add(ENV, f"{t} ({i})", f"{c} Variant {i}.") for i in range(n) for t, c in [LESSONS[i % len(LESSONS)]]
    ]
    for start in range(0, n, 50):
        store.apply(ops[start : start + 50], step=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2, help="task instances per batch")
    parser.add_argument("--k", type=int, default=8, help="rollouts per task instance")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--entries", type=int, default=200, help="entries in the bank")
    args = parser.parse_args()

    with throwaway_database("bench_studio_overhead"):
        run_benchmark(args)


def run_benchmark(args: argparse.Namespace) -> None:
    from django.contrib.auth.models import User

    from experience.manager import ExperienceManager
    from trainer.assemble import build_engine
    from trainer.coevolution import BankRetriever
    from trainer.config import get_preset
    from trainer.loop import sample_tasks
    from trainer.models import default_model_path, load_tokenizer, prepare_default_models
    from trainer.rollout.runner import EpisodeRunner
    from webapp.models import Run

    path = prepare_default_models(default_model_path())
    cfg = get_preset("cpu").with_overrides(
        **{"env": ENV, "tasks_per_step": args.tasks, "k_rollouts": args.k, "actor.model_path": str(path)}
    )
    user, _ = User.objects.get_or_create(username="bench")
    run = Run.objects.create(name="overhead", owner=user, config=cfg.to_dict())
    r = cfg.rollout
    engine = build_engine(cfg)
    tokenizer = load_tokenizer(path)
    runner_options = {
        "max_new_tokens": r.max_new_tokens,
        "temperature": r.temperature,
        "turn_limit": r.turn_limit,
        "context_tokens": r.context_tokens,
    }
    runners: list[EpisodeRunner] = []
    try:
        with ExperienceManager(run.pk) as store:
            seed_bank(store, args.entries)
            retrieve = BankRetriever(store, cfg)
            batches = [batch_pair(sample_tasks(cfg, step)) for step in range(args.repeat + 1)]
            natural = EpisodeRunner(engine, tokenizer, **runner_options)
            fixed = EpisodeRunner(FixedLength(engine), tokenizer, **runner_options)
            runners += [natural, fixed]
            arms = {  # name: (runner, guided?, retriever)
                "free": (natural, False, None),
                "guided": (natural, True, retrieve),
                "free fixed": (fixed, False, None),
                "guided fixed": (fixed, True, retrieve),
            }
            rows: dict[str, list[tuple[float, ...]]] = {name: [] for name in arms}
            prompt_tokens: dict[str, list[int]] = {name: [] for name in arms}
            for repeat, pair in enumerate(batches):  # the first round only warms up
                for name, (runner, guided, fn) in arms.items():
                    engine.reset_cache()  # as after the weight sync that starts every training step
                    episodes, stats = runner.run(pair[guided], retrieve=fn)
                    if repeat == 0:
                        continue
                    rows[name].append(measure(episodes, stats))
                    prompt_tokens[name] += [len(e.segments[0].prompt_ids) for e in episodes]
    finally:
        for runner in runners:
            runner.close()
        engine.close()
    report(args, len(batches[0][0]), rows, prompt_tokens)


def batch_pair(specs):
    """The same episodes played experience-free and experience-guided."""
    return tuple([replace(s, guided=guided) for s in specs] for guided in (False, True))


class FixedLength:
    """The actor's engine with every completion made exactly ``max_new_tokens`` long (EOS held back)."""

    def __init__(self, engine) -> None:
        self.inner = engine

    def generate(self, requests):
        return self.inner.generate([replace(r, min_new_tokens=r.max_new_tokens) for r in requests])

    def __getattr__(self, name):
        return getattr(self.inner, name)


def measure(episodes, stats) -> tuple[float, ...]:
    """Batch wall s, s per engine turn, ms per generated token, retrieval ms, decode steps per turn."""
    turns = max(len(e.turns) for e in episodes)
    longest = [max(e.turns[t].num_tokens for e in episodes if len(e.turns) > t) for t in range(turns)]
    return (
        stats.wall_s,
        stats.wall_s / max(stats.engine_calls, 1),
        stats.wall_s / max(stats.generated_tokens, 1) * 1000,
        stats.retrieve_s * 1000,
        statistics.mean(longest),
    )


def report(args, episodes: int, rows, prompt_tokens) -> None:
    print(f"{ENV}: {episodes} episodes per batch, bank of {args.entries} entries, {args.repeat} repeats")
    print("'fixed': every completion exactly max_new_tokens long, so both arms decode the same steps")
    head = ("batch s", "s/turn", "ms/token", "retrieve ms", "decode steps/turn", "prompt tokens")
    print(f"{'':13}" + "".join(f"{h:>18}" for h in head))
    med = {}
    for name, values in rows.items():
        med[name] = [statistics.median(col) for col in zip(*values, strict=True)]
        figures = [*med[name], statistics.mean(prompt_tokens[name])]
        print(f"{name:13}" + "".join(f"{v:18.2f}" for v in figures))
    for free, guided in (("free", "guided"), ("free fixed", "guided fixed")):
        for i, label in enumerate(("batch wall time", "time per turn", "time per token")):
            change = 100 * (med[guided][i] / med[free][i] - 1)
            print(f"overhead, {guided} vs {free} ({label}): {change:+.1f}% (target <= 5%)")
    share = 100 * med["guided"][3] / 1000 / med["guided"][0]
    print(f"retrieval alone: {share:.2f}% of the guided batch time")


if __name__ == "__main__":
    main()
