"""Does an entry in the system prompt change the actor's greedy play? (issue 13: the with / without columns)

    python benchmarks/bench_prompt_sensitivity.py [--actor DIR] [--bank FILE] [--episodes 16]

Plays the first ``--episodes`` instances of the config's eval split greedily, once without experience and
once per entry of ``--bank`` (a bank export, JSONL) with that entry injected into every episode's system
prompt, as the "with experience" evaluation does. Prints per entry: successes with and without, and how many
episodes took exactly the same action sequence as without; then the totals. An actor that reads its prompt
changes some sequences; identical sequences everywhere mean the with-experience column can only equal the
other. ``--actor``: a model or checkpoint's ``actor/`` folder [the untrained SmolLM2-135M-Instruct].
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.outputs import write_output  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs/cpu-room-random-grpo.toml"))
    parser.add_argument("--actor", type=Path, help="model folder [the untrained actor]")
    parser.add_argument("--bank", type=Path, default=ROOT / "configs/experiments/room-curated.jsonl")
    parser.add_argument("--episodes", type=int, default=16)
    args = parser.parse_args()

    from trainer.config import RunConfig
    from trainer.evaluate import EVAL_TEMPERATURE, eval_runner, eval_specs
    from trainer.rollout.base import engine_from_config
    from trainer.rollout.runner import Experience

    cfg = RunConfig.from_file(args.config)
    actor = args.actor or Path(cfg.actor.model_path)
    r = cfg.rollout
    engine = engine_from_config(actor, r, seed=cfg.seed)
    runner = eval_runner(engine, actor, r)
    lines = args.bank.read_text(encoding="utf-8").splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]

    def play(text: str | None) -> list:
        specs = eval_specs(cfg.env, args.episodes, guided=text is not None)
        retrieve = (lambda queries: [Experience(text)] * len(queries)) if text else None
        return runner.run(specs, retrieve=retrieve, temperature=EVAL_TEMPERATURE)[0]

    def actions(episode) -> list:
        return [t.action for t in episode.turns]

    try:
        base = play(None)
        n, wins = len(base), sum(e.success for e in base)
        print(f"actor {actor}, {cfg.env}, {n} eval episodes, greedy; without experience: {wins}/{n} succeed")
        same_total = won_total = 0
        rows = [
            {
                "entry": "(without experience)",
                "success": f"{wins}/{n}",
                "identical action sequences": f"{n}/{n}",
            }
        ]
        for entry in entries:
            played = play(f"{entry['title']}\n{entry['content']}")
            same = sum(actions(a) == actions(b) for a, b in zip(played, base, strict=True))
            won = sum(e.success for e in played)
            same_total, won_total = same_total + same, won_total + won
            title = entry["title"][:44]
            print(f"  {title:44s} success {won:>3}/{n}   identical action sequences {same:>3}/{n}")
            row = {"entry": title, "success": f"{won}/{n}", "identical action sequences": f"{same}/{n}"}
            rows.append(row)
        plays = n * len(entries)
        print(
            f"all {len(entries)} entries: success {won_total}/{plays} (without: {wins * len(entries)}), "
            f"identical action sequences {same_total}/{plays}"
        )
        rows.append({"entry": f"all {len(entries)} entries", "success": f"{won_total}/{plays}",
                     "identical action sequences": f"{same_total}/{plays}"})  # fmt: skip
        figures = {"actor": str(actor), "env": cfg.env, "episodes": n, "rows": rows}
        write_output("prompt-sensitivity", figures)
    finally:
        runner.close()
        engine.close()


if __name__ == "__main__":
    main()
