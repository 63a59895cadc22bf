"""Figures for SWE-mini: expert and random success, reset and step costs (median seconds).

python -m trainer.envs.swe.measure --episodes 50 --random-episodes 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from trainer.envs import make_env
from trainer.envs.swe.env import SWEMiniEnv, random_action


def _timed(fn, *args):  # noqa: ANN001, ANN202
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def measure(split: str, episodes: int, random_episodes: int, subset: str = "all") -> dict[str, float]:
    env: SWEMiniEnv = make_env("SWE-mini", split, subset=subset)  # type: ignore[assignment]
    costs: dict[str, list[float]] = {"reset": [], "replace": [], "run_tests": [], "submit": [], "other": []}
    solved = 0
    failed: list[str] = []
    for seed in range(episodes):
        _, dt = _timed(env.reset, seed)
        costs["reset"].append(dt)
        done, info = False, {}
        while not done:
            action = env.expert_action()
            (_, _, done, info), dt = _timed(env.step, action)
            costs[action.split("[")[0]].append(dt)
        solved += bool(info["success"])
        if not info["success"]:
            failed.append(info["instance_id"])
    rng = random.Random(0)
    random_solved = 0
    for seed in range(random_episodes):
        env.reset(seed)
        done, info = False, {}
        while not done:
            action = random_action(env, rng)
            verb = action.split("[")[0]
            (_, _, done, info), dt = _timed(env.step, action)
            costs[verb if verb in costs else "other"].append(dt)
        random_solved += bool(info["success"])
    env.close()
    figures = {
        "expert_success": solved / max(episodes, 1),
        "random_success": random_solved / max(random_episodes, 1),
    }
    figures |= {f"median_{k}_s": statistics.median(v) for k, v in costs.items() if v}
    print(f"SWE-mini {split}/{subset}: expert {solved}/{episodes}, random {random_solved}/{random_episodes}")
    if failed:
        print("expert failed on:", ", ".join(failed))
    for k, v in figures.items():
        print(f"  {k}: {v:.4f}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--split", default="eval")
    parser.add_argument("--subset", default="all")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--random-episodes", type=int, default=20)
    args = parser.parse_args()
    measure(args.split, args.episodes, args.random_episodes, args.subset)


if __name__ == "__main__":
    main()
