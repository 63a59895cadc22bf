"""Each rank's rollout time on N processes (issue 47), with the guided episodes on rank 0 (as earlier
versions placed them while Search-and-Ask was on) and with every rank playing its share (now), and the
rollout efficiency that per-episode costs project for 8 ranks.

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 4 \\
        benchmarks/bench_rank_rollouts.py [--repeats 3] [--output rank-rollouts]

One training step of the cpu preset on ``MiniHack-Room-Random-5x5`` (2 tasks × K = 8, 4 guided + 4 free a
task, turn limit 4, 8 new tokens a turn, SmolLM2-135M through an HF engine per rank). Guided episodes get one
experience (a fixed entry served by a stand-in bank on rank 0) and play with Search-and-Ask on, the
collective intercept every rank joins each turn. A rank's time is what it spent generating and stepping its
envs (``RolloutStats.generate_s + env_s``), not waiting for the others; each layout is played ``--repeats``
times and each rank's median kept. The processes share this box's 2 cores, so a rank's seconds here are not a
GPU's; the projection therefore uses per-episode costs (a rank's seconds over its episodes, guided and free
fitted separately) and counts what each rank would play on 8 ranks: efficiency = mean over max of the ranks'
projected seconds (1.0: the step waits for no rank).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.outputs import write_output  # noqa: E402
from trainer import parallel  # noqa: E402
from trainer.coevolution import SearchAndAsk  # noqa: E402
from trainer.config import get_preset  # noqa: E402
from trainer.extractor.model import Extractor  # noqa: E402
from trainer.loop import sample_tasks  # noqa: E402
from trainer.models import default_model_path, load_tokenizer, prepare_default_models  # noqa: E402
from trainer.rollout.hf import HFEngine  # noqa: E402
from trainer.rollout.runner import EpisodeRunner, Experience  # noqa: E402
from trainer.store import Entry  # noqa: E402

ENTRY = Entry(
    1, "MiniHack-Room-Random-5x5", "Find the stairs", "The stairs '>' are in the room: walk to them."
)


class OneEntryBank:
    """Rank 0's stand-in bank: the same entry for every retrieval and search; exchanges are counted."""

    exchanges = 0

    def retrieve(self, queries, scope, k=1, *, count=True):
        return [[ENTRY] for _ in queries]

    def record_ask(self, query, scope, entry, refinement, *, episode_id="", step=0):
        self.exchanges += 1
        return self.exchanges


def rank_zero_owners(guided: list[bool], world: int) -> list[int]:
    """The earlier placement while Search-and-Ask was on: every guided episode on rank 0, each free one on
    the rank with the fewest so far."""
    load = [0] * world
    load[0] = sum(guided)
    owners = []
    for g in guided:
        rank = 0 if g else min(range(world), key=lambda r: (load[r], r))
        load[rank] += 0 if g else 1
        owners.append(rank)
    return owners


def play(runner: EpisodeRunner, specs, owners, tool) -> tuple[float, int, int]:
    """This rank's busy seconds and its guided and free episodes for one layout (a collective)."""
    rank = parallel.rank()
    mine = [s for s, r in zip(specs, owners, strict=True) if r == rank]
    positions = [i for i, r in enumerate(owners) if r == rank]

    def retrieve(queries):
        return [Experience(ENTRY.text, ENTRY.id, 1, 1.0) for _ in queries]

    parallel.barrier()
    _, stats = runner.run(mine, retrieve=retrieve, intercept=tool, positions=positions)
    guided = sum(s.guided for s in mine)
    return stats.generate_s + stats.env_s, guided, len(mine) - guided


def per_episode_costs(rows: list[dict]) -> tuple[float, float]:
    """Seconds per guided and per free episode: least squares of seconds = g·guided + f·free over every
    rank of every layout (the prompt with an experience is longer, so a guided episode may cost more)."""
    sgg = sum(r["guided"] ** 2 for r in rows)
    sff = sum(r["free"] ** 2 for r in rows)
    sgf = sum(r["guided"] * r["free"] for r in rows)
    sgs = sum(r["guided"] * r["seconds"] for r in rows)
    sfs = sum(r["free"] * r["seconds"] for r in rows)
    det = sgg * sff - sgf * sgf
    return (sgs * sff - sfs * sgf) / det, (sfs * sgg - sgs * sgf) / det


def projected_efficiency(guided: list[bool], owners: list[int], world: int, g: float, f: float) -> float:
    seconds = [0.0] * world
    for is_guided, r in zip(guided, owners, strict=True):
        seconds[r] += g if is_guided else f
    return statistics.mean(seconds) / max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="rank-rollouts", help="output name ('' prints only)")
    args = parser.parse_args()
    placement = parallel.init_distributed("cpu")
    world = placement.world_size
    cfg = get_preset("cpu").with_overrides(
        method="complementary", env="MiniHack-Room-Random-5x5", tasks_per_step=2, k_rollouts=8, nproc=world
    )
    model = str(prepare_default_models(default_model_path()))
    engine, tokenizer = HFEngine(model), load_tokenizer(model)
    runner = EpisodeRunner(engine, tokenizer, max_new_tokens=8, turn_limit=4)
    store = OneEntryBank() if placement.rank == 0 else None
    tool = SearchAndAsk(store, Extractor(engine, tokenizer, max_new_tokens=8), cfg, None)
    specs = sample_tasks(cfg, step=1)
    guided = [s.guided for s in specs]
    layouts = {"guided on rank 0 (before)": rank_zero_owners(guided, world),
               "every rank its share (now)": parallel.owners(guided, world)}  # fmt: skip
    play(runner, specs, layouts["every rank its share (now)"], tool)  # warm-up: first calls are slower
    measured: dict[str, list[list[float]]] = {name: [] for name in layouts}
    counts: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeats):
        for name, owners in layouts.items():
            t0 = time.perf_counter()
            seconds, n_guided, n_free = play(runner, specs, owners, tool)
            wall = parallel.gather_values(time.perf_counter() - t0)
            measured[name].append(parallel.gather_values(seconds) + [max(wall)])
            counts[name] = (n_guided, n_free)
    shares = {name: parallel.gather_values(counts[name]) for name in layouts}
    engine.close()
    if placement.rank == 0:
        report(args, world, layouts, measured, shares)
    parallel.barrier()
    parallel.destroy()


def report(args, world, layouts, measured, shares) -> None:
    per_rank = []
    for name in layouts:
        for r in range(world):
            seconds = statistics.median(run[r] for run in measured[name])
            per_rank.append({"layout": name, "rank": r, "guided": shares[name][r][0],
                             "free": shares[name][r][1], "seconds": seconds})  # fmt: skip
    g, f = per_episode_costs(per_rank)
    paper = [k < 4 for _ in range(8) for k in range(8)]  # the paper's step: 8 tasks × K = 8, 4 + 4
    rows = []
    for name in layouts:
        mine = [r for r in per_rank if r["layout"] == name]
        secs = [r["seconds"] for r in mine]
        earlier = name.startswith("guided on rank 0")
        at8 = rank_zero_owners(paper, 8) if earlier else parallel.owners(paper, 8)
        rows.append({
            "layout": name, "ranks": world,
            "episodes a rank (guided + free)": ", ".join(f"{r['guided']}+{r['free']}" for r in mine),
            "busy s a rank (median)": ", ".join(f"{s:.1f}" for s in secs),
            "slowest rank s": round(max(secs), 2),
            "step's rollout wall s (median)": round(statistics.median(run[-1] for run in measured[name]), 2),
            f"efficiency on {world} (mean / max)": round(statistics.mean(secs) / max(secs), 3),
            "projected efficiency on 8 ranks": round(projected_efficiency(paper, at8, 8, g, f), 3),
        })  # fmt: skip
    for row in rows:
        print(row)
    print(f"per-episode cost: guided {g:.2f} s, free {f:.2f} s ({args.repeats} repeats)")
    if args.output:
        figures = {"rows": rows, "per_guided_episode_s": round(g, 3), "per_free_episode_s": round(f, 3),
                   "repeats": args.repeats}  # fmt: skip
        write_output(args.output, figures)


if __name__ == "__main__":
    main()
