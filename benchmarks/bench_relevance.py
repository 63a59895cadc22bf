"""What diversified retrieval hands out under s_rank = −rank (default) vs s_rank = cosine similarity.

    python benchmarks/bench_relevance.py --run RUN_ID [--step-seconds 180]

Replays a real run's retrievals offline on its bank as it is now: the guided rollouts of every training step
the run recorded (each task instance asks K/2 identical queries, "goal: …, observation: …" from the env's
own reset), served in turn through ``experience.retrieval.rerank_in_turn`` with retrieval counts and
recency carried from query to query, once per relevance mode, from the same starting counters (none). The
clock advances ``--step-seconds`` per training step (the recency window is 300 s). Prints per mode: the mean
cosine similarity of the entries handed out, their mean rank among the candidates, how many distinct entries
were handed out, and the share of picks outside the 3 most similar candidates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=int, required=True, help="a run with a bank and recorded episodes")
    parser.add_argument("--step-seconds", type=float, default=180.0)
    parser.add_argument("--oversample", type=int, default=16)
    args = parser.parse_args()

    import django

    django.setup()
    from experience.embedding import default_embedder
    from experience.models import Experience
    from experience.retrieval import Candidate, rerank_in_turn
    from trainer.envs.base import make_env
    from trainer.rollout.runner import RetrievalQuery
    from webapp.models import EpisodeRecord

    entries = list(Experience.objects.in_bank(args.run).values_list("id", "embedding"))
    if not entries:
        sys.exit(f"run {args.run} has no live bank entries")
    ids = [i for i, _ in entries]
    bank = np.stack([np.asarray(v, dtype=np.float32) for _, v in entries])  # (N, d), unit rows
    groups = (
        EpisodeRecord.objects.filter(run_id=args.run, kind="train", guided=True)
        .values_list("step", "env", "seed", "task_instance")
        .order_by("step", "task_instance")
    )
    asks: dict[tuple, int] = {}
    for step, env, seed, group in groups:
        asks[(step, env, seed, group)] = asks.get((step, env, seed, group), 0) + 1
    embedder = default_embedder()
    texts = {}
    for _, env_name, seed, _ in asks:
        if (env_name, seed) not in texts:
            env = make_env(env_name, split="train")
            observation, _ = env.reset(seed)
            texts[(env_name, seed)] = RetrievalQuery(env_name, env.goal, observation).text
            env.close()
    vectors = dict(zip(texts, embedder.embed(list(texts.values())), strict=True))
    print(
        f"run {args.run}: {len(ids)} entries, {len(asks)} task instances, "
        f"{sum(asks.values())} guided queries\n"
    )
    print(
        "| s_rank | mean similarity handed out | mean rank among candidates | distinct entries "
        "| picks outside top 3 |"
    )
    print("|---|---|---|---|---|")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for relevance in ("rank", "similarity"):
        counts: dict[int, int] = {}
        last: dict[int, datetime] = {}
        sims, ranks, used = [], [], set()
        for (step, env_name, seed, _), n in asks.items():
            now = t0 + timedelta(seconds=step * args.step_seconds)
            scores = bank @ vectors[(env_name, seed)]
            top = np.argsort(-scores)[: args.oversample]
            cands = [
                Candidate(ids[j], float(scores[j]), counts.get(ids[j], 0), last.get(ids[j])) for j in top
            ]
            rank_of = {c.id: r for r, c in enumerate(cands)}
            for chosen in rerank_in_turn(cands, 1, n, now, relevance=relevance):
                c = chosen[0]
                sims.append(c.similarity)
                ranks.append(rank_of[c.id])
                used.add(c.id)
                counts[c.id] = counts.get(c.id, 0) + 1
                last[c.id] = now
        outside = sum(r >= 3 for r in ranks) / len(ranks)
        print(
            f"| {relevance} | {statistics.mean(sims):.3f} | {statistics.mean(ranks):.2f} | {len(used)} "
            f"| {outside:.0%} |"
        )


if __name__ == "__main__":
    main()
