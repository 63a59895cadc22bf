"""ALFWorld games and figures from the command line.

python -m trainer.envs.alfworld generate --split train --count 200   # fill the game cache
python -m trainer.envs.alfworld bench --episodes 50                   # expert/random/costs
python -m trainer.envs.alfworld check-original                        # ALFWorld's own env and experts
python -m trainer.envs.alfworld freeze-eval --count 60                # rewrite the frozen split (rarely!)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from trainer.envs.alfworld.engine import Engine
from trainer.envs.alfworld.env import ALFWorldEnv
from trainer.envs.alfworld.original import EXPERTS, check_original
from trainer.envs.alfworld.sources import freeze_eval_split


def generate(split: str, count: int) -> None:
    env = ALFWorldEnv(split)
    for seed in range(count):
        start = time.perf_counter()
        obs, info = env.reset(seed)
        print(f"{split} {seed}: {info['goal']} ({time.perf_counter() - start:.1f} s)")


def bench(split: str, episodes: int, random_episodes: int) -> None:
    env = ALFWorldEnv(split)
    resets, steps, wins, lengths = [], [], 0, []
    for seed in range(episodes):
        start = time.perf_counter()
        env.reset(seed)
        resets.append(time.perf_counter() - start)
        done, info, n = False, {}, 0
        while not done:
            action = env.expert_action()
            start = time.perf_counter()
            _, _, done, info = env.step(action)
            steps.append(time.perf_counter() - start)
            n += 1
        wins += bool(info["success"])
        lengths.append(n)
    mean = statistics.mean(lengths)
    print(f"expert: {wins}/{episodes} successes on {split} seeds 0..{episodes - 1}, mean {mean:.1f} steps")
    print(
        f"reset: median {statistics.median(resets):.2f} s (first load of each game), max {max(resets):.2f} s"
    )
    print(f"step: median {statistics.median(steps) * 1000:.0f} ms over {len(steps)} steps")
    rng, rwins = random.Random(0), 0
    for seed in range(random_episodes):
        env.reset(seed)
        done, info = False, {}
        while not done:
            _, _, done, info = env.step(rng.choice(env.admissible_actions() or ["look"]))
        rwins += bool(info["success"])
    print(f"random valid-action policy: {rwins}/{random_episodes} successes ({env.max_turns} turns)")
    start = time.perf_counter()
    env.reset(random_episodes - 1)
    print(f"reset of the game already loaded: {time.perf_counter() - start:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.envs.alfworld", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("generate", help="generate (and cache) the games of seeds 0..count-1")
    p.add_argument("--split", choices=("train", "eval"), default="train")
    p.add_argument("--count", type=int, default=100)
    p = sub.add_parser("bench", help="expert success, random-policy success, reset and step costs")
    p.add_argument("--split", choices=("train", "eval"), default="eval")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--random-episodes", type=int, default=20)
    p = sub.add_parser("check-original", help="the eval games in ALFWorld's own env, solved by its experts")
    p.add_argument("--count", type=int, help="only the first COUNT eval games (default: all)")
    p.add_argument("--expert", choices=EXPERTS, action="append", help="default: both")
    p = sub.add_parser("freeze-eval", help="regenerate and overwrite the frozen eval split")
    p.add_argument("--count", type=int, default=60)
    args = parser.parse_args()
    if args.command == "generate":
        generate(args.split, args.count)
    elif args.command == "bench":
        bench(args.split, args.episodes, args.random_episodes)
    elif args.command == "check-original":
        raise SystemExit(0 if check_original(args.count, args.expert or EXPERTS) else 1)
    else:
        print(f"wrote {freeze_eval_split(args.count, Engine())}")


if __name__ == "__main__":
    main()
