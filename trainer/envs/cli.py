"""Look at environments from a terminal: play one by hand, watch the expert, benchmark them all.

``manage.py play``, ``manage.py expert_episode`` and ``manage.py bench_envs`` are thin wrappers of
these functions (which never need Django).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any, TextIO

from trainer.envs.base import TextEnv, env_names, make_env


def play(
    env_name: str, split: str = "train", seed: int = 0, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout
) -> bool:
    """Play one episode by hand: print observations, read actions from ``stdin``; ``quit`` ends.

    ``expert`` as an action executes the expert's move. Returns whether the episode succeeded.
    """
    env = make_env(env_name, split)
    try:
        obs, info = env.reset(seed)
        print(f"{env_name} ({split} instance {seed}); type an action, 'expert' or 'quit'.", file=stdout)
        print(obs, file=stdout)
        _print_admissible(info, stdout)
        while True:
            print("> ", end="", file=stdout, flush=True)
            line = stdin.readline()
            if not line or line.strip().lower() == "quit":
                print("Quit.", file=stdout)
                return False
            action = env.expert_action() if line.strip().lower() == "expert" else line.strip()
            obs, reward, done, info = env.step(action)
            print(obs, file=stdout)
            if done:
                print(
                    f"Episode over after {env.turn} turns: {_outcome(info)} (reward {reward}).", file=stdout
                )
                return bool(info["success"])
            _print_admissible(info, stdout)
    finally:
        env.close()


def expert_episode(env_name: str, split: str = "eval", seed: int = 0, stdout: TextIO = sys.stdout) -> bool:
    """Print one episode of the expert, turn by turn. Returns whether it succeeded."""
    env = make_env(env_name, split)
    try:
        obs, info = env.reset(seed)
        print(f"{env_name} ({split} instance {seed})\n{obs}", file=stdout)
        done = False
        while not done:
            action = env.expert_action()
            obs, reward, done, info = env.step(action)
            print(f"\n--- turn {env.turn}: {action}\n{obs}", file=stdout)
        print(f"\nEpisode over after {env.turn} turns: {_outcome(info)} (reward {reward}).", file=stdout)
        return bool(info["success"])
    finally:
        env.close()


def _print_admissible(info: dict[str, Any], stdout: TextIO) -> None:
    if info.get("admissible_actions"):
        print("Valid actions: " + ", ".join(info["admissible_actions"]), file=stdout)


def _outcome(info: dict[str, Any]) -> str:
    return "success" if info["success"] else "failure"


# ---- benchmark -------------------------------------------------------------------------------
def run_episode(
    env: TextEnv, seed: int, policy: str, rng: random.Random | None = None
) -> tuple[bool, list[float]]:
    """One episode with the ``expert`` or a ``random`` valid-action policy; (success, step seconds)."""
    obs, info = env.reset(seed)
    step_s: list[float] = []
    done = False
    while not done:
        if policy == "expert":
            action = env.expert_action()
        else:
            assert rng is not None
            action = rng.choice(info["admissible_actions"] or [""])  # "" is an invalid action: a lost turn
        t = time.perf_counter()
        obs, _, done, info = env.step(action)
        step_s.append(time.perf_counter() - t)
    return bool(info["success"]), step_s


def bench_env(env_name: str, episodes: int = 50, expert_seeds: int = 50) -> dict[str, Any]:
    """Reset and step cost (medians), expert success on the first eval seeds, random-policy success."""
    env = make_env(env_name, "eval")
    try:
        n_inst = env.num_instances()
        n_expert = min(expert_seeds, n_inst) if n_inst else expert_seeds
        env.reset(0)  # warm up: the first reset creates engines and loads the split
        reset_s = []
        for seed in range(min(episodes, n_expert)):
            t = time.perf_counter()
            env.reset(seed)
            reset_s.append(time.perf_counter() - t)
        expert_ok, step_s, turns = 0, [], []
        for seed in range(n_expert):
            ok, steps = run_episode(env, seed, "expert")
            expert_ok += ok
            step_s += steps
            turns.append(len(steps))
        row: dict[str, Any] = {
            "env": env_name,
            "reset_ms": 1000 * statistics.median(reset_s),
            "step_ms": 1000 * statistics.median(step_s),
            "expert": f"{expert_ok}/{n_expert}",
            "expert_rate": expert_ok / n_expert,
            "expert_turns": statistics.mean(turns),
            "max_turns": env.max_turns,
        }
        _, info = env.reset(0)
        if info.get("admissible_actions"):
            rng = random.Random(0)
            n_random = min(episodes, n_inst) if n_inst else episodes
            random_ok = sum(run_episode(env, seed, "random", rng)[0] for seed in range(n_random))
            row |= {"random": f"{random_ok}/{n_random}", "random_rate": random_ok / n_random}
        else:
            row |= {"random": "n/a (no admissible actions)", "random_rate": None}
        return row
    finally:
        env.close()


def bench(
    names: list[str] | None = None, episodes: int = 50, stdout: TextIO = sys.stdout
) -> list[dict[str, Any]]:
    """Benchmark every registered env (or those named) and print a markdown table."""
    names = names or env_names()
    header = (
        "env",
        "reset ms",
        "step ms",
        "expert success (eval)",
        "expert turns",
        "turn limit",
        "random success",
    )
    print("| " + " | ".join(header) + " |", file=stdout)
    print("|---|---:|---:|---:|---:|---:|---:|", file=stdout)
    rows = []
    for name in names:
        try:
            row = bench_env(name, episodes)
        except Exception as exc:  # one broken env should not hide the others' figures
            print(f"| {name} | error: {type(exc).__name__}: {exc} | | | | | |", file=stdout, flush=True)
            continue
        rows.append(row)
        print(
            f"| {name} | {row['reset_ms']:.2f} | {row['step_ms']:.3f} "
            f"| {row['expert']} ({100 * row['expert_rate']:.0f}%) | {row['expert_turns']:.1f} "
            f"| {row['max_turns']} | {row['random']} |",
            file=stdout,
            flush=True,
        )
    return rows
