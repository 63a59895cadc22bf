"""Does the actor ever ask the bank? Search-and-Ask's reach before any training (issue 46, point 4)

    python benchmarks/bench_search_and_ask.py [--actor DIR] [--samples 4]

The dark pool's 16 rooms, each played ``--samples`` times at the training temperature with the room's true
entry followed by each variant of the tool's note (``trainer.coevolution.TOOL_NOTES``; "none": the entry
alone), placed as the grid's guided episodes get it (``experience.placement`` 'turn': after every
observation, right before the answer) and as the paper places it (the system prompt); then, in the grid's
placement, the note offered only at stuck points (``experience.tool_offer`` 'stuck': next to an observation
after an action that changed nothing, ``trainer.coevolution.changed_nothing``). Counts the turns
whose reply opens a question (``<search>``, as the Search-and-Ask intercept reads it) and the episodes with at
least one. GRPO can only reinforce an ask that some rollout makes: a variant whose asks never occur cannot be
learnt. Replies are the run's (``rollout.max_new_tokens``); no question is answered, so an episode that asks
goes on as if it had played an invalid move. ``--actor``: a model or a checkpoint's ``actor/`` folder [the
untrained actor].
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.outputs import write_output  # noqa: E402

CONFIG = ROOT / "configs/cpu-dark-pool-grpo-lora.toml"
BUDGET = {"rollout.turn_limit": 8, "rollout.max_new_tokens": 8}
"""The dark-pool grid's budget (configs/experiments/dark-pool.toml)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actor", type=Path, help="model folder [the untrained actor]")
    parser.add_argument("--samples", type=int, default=4, help="episodes per room and variant")
    args = parser.parse_args()

    from trainer.coevolution import SEARCH_TAG, TOOL_NOTES
    from trainer.config import RunConfig
    from trainer.envs.minihack_pool import load_pool, oracle_entries
    from trainer.evaluate import eval_runner
    from trainer.rollout.base import engine_from_config
    from trainer.rollout.runner import EpisodeSpec, Experience

    cfg = RunConfig.from_file(CONFIG).with_overrides(**BUDGET)
    actor = args.actor or Path(cfg.actor.model_path)
    rooms = load_pool(cfg.env)
    truth = {
        room.name: f"{e['title']}\n{e['content']}"
        for room, e in zip(rooms, oracle_entries(cfg.env), strict=True)
    }
    engine = engine_from_config(actor, cfg.rollout, seed=cfg.seed)
    placements = dict.fromkeys((cfg.experience.placement, "system"))  # the grid's first
    runners = {p: eval_runner(engine, actor, cfg.rollout, placement=p) for p in placements}
    limit = cfg.experience.search_and_ask_max

    def entry_for(query) -> str:
        (name,) = [n for n in truth if f"This is the {n} room." in query.goal]
        return truth[name]

    def play(runner, note: str, stuck: str = "") -> dict:
        specs = [
            EpisodeSpec(cfg.env, seed, group=seed, guided=True, sample_seed=1000 * seed + 97 * k)
            for seed in range(len(rooms))
            for k in range(args.samples)
        ]
        text = (lambda q: f"{entry_for(q)}\n\n{note.format(limit=limit)}") if note else entry_for
        probe = StuckPoints(cfg, stuck) if stuck else None
        episodes, _ = runner.run(
            specs,
            retrieve=lambda qs: [Experience(text(q)) for q in qs],
            temperature=cfg.rollout.temperature,
            intercept=probe,
        )
        asks = [sum(bool(SEARCH_TAG.search(t.action_text)) for t in e.turns) for e in episodes]
        asked = [t.action_text.strip() for e in episodes for t in e.turns if SEARCH_TAG.search(t.action_text)]
        return {
            "episodes": len(episodes),
            "turns": sum(len(e.turns) for e in episodes),
            "asking turns": sum(asks),
            "episodes that ask": sum(a > 0 for a in asks),
            "turns offered the tool": probe.offered if probe else None,
            "successes": sum(e.success for e in episodes),
            "what was asked (up to 3 distinct replies)": " · ".join(
                "`" + t.replace("|", "/").replace("`", "'") + "`" for t in list(dict.fromkeys(asked))[:3]
            ),
        }

    try:
        rows = []
        for placement, runner in runners.items():
            for name, note in {"none": "", **TOOL_NOTES}.items():
                offer = "with the entry" if note else "–"
                row = {"placement": placement, "note": name, "offered": offer} | play(runner, note)
                rows.append(row)
                print(row, flush=True)
        for name in TOOL_NOTES:
            row = {"placement": cfg.experience.placement, "note": name, "offered": "at stuck points"}
            rows.append(row | play(runners[cfg.experience.placement], "", stuck=name))
            print(rows[-1], flush=True)
        figures = {"actor": str(actor), "env": cfg.env, "samples per room": args.samples,
                   "temperature": cfg.rollout.temperature, "rows": rows}  # fmt: skip
        write_output("search-and-ask-reach", figures)
    finally:
        for runner in runners.values():
            runner.close()
        engine.close()


class StuckPoints:
    """The probe's intercept: answers no question (an ask goes to the env, as in the other rows) and offers
    the tool where ``SearchAndAsk`` would at stuck points, counting the offers."""

    collective = False

    def __init__(self, cfg, note: str) -> None:
        from trainer.coevolution import SearchAndAsk

        options = {"experience.tool_offer": "stuck", "experience.tool_note": note}  # as a complementary run
        self.tool = SearchAndAsk(None, None, cfg.with_overrides(method="complementary", **options), None)
        assert self.tool.limit > 0, "the tool is off in this config"
        self.offered = 0

    def __call__(self, states, texts) -> list[None]:
        return [None] * len(states)

    def offer(self, state) -> str | None:
        offer = self.tool.offer(state)
        self.offered += offer is not None
        return offer


if __name__ == "__main__":
    main()
