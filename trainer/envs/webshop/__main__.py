"""``python -m trainer.envs.webshop freeze`` writes the eval split; ``bench`` prints the report figures."""

from __future__ import annotations

import random
import statistics
import sys
import time

from trainer.envs.splits import split_path, write_split
from trainer.envs.webshop import catalogue
from trainer.envs.webshop.env import WebShopEnv, random_valid_action, synthetic_eval_goals, synthetic_world


def freeze() -> None:
    goals = synthetic_eval_goals()
    digest = write_split(split_path("WebShop-synth"), goals)
    print(f"wrote {len(goals)} eval goals to {split_path('WebShop-synth')} (sha256 {digest[:12]})")


def bench(n_eval: int = 50, n_random: int = 200) -> None:
    t = time.perf_counter()
    cat = catalogue.generate_catalogue(0)
    products = catalogue.normalize_products(cat["items"], cat["attributes"])
    t_gen = time.perf_counter() - t
    t = time.perf_counter()
    synthetic_world()
    t_world = time.perf_counter() - t
    print(
        f"catalogue: {len(products)} products, {len({p['query'] for p in products})} categories, "
        f"{len(cat['goals'])} base goals; generate+normalise {t_gen:.2f} s; "
        f"whole world with BM25 index {t_world:.2f} s"
    )

    env = WebShopEnv("eval")
    wins, turns, resets, searches, clicks, fallbacks = 0, [], [], [], [], 0
    for seed in range(n_eval):
        t = time.perf_counter()
        env.reset(seed)
        resets.append(time.perf_counter() - t)
        while not env.done:
            action = env.expert_action()
            t = time.perf_counter()
            _, reward, done, info = env.step(action)
            (searches if action.startswith("search") else clicks).append(time.perf_counter() - t)
        wins += info["success"]
        turns.append(env.turn)
        fallbacks += env._expert_searches > 1
    print(
        f"expert on eval seeds 0..{n_eval - 1}: success {wins}/{n_eval} = {wins / n_eval:.0%}, "
        f"mean turns {statistics.mean(turns):.1f}, title-search fallbacks {fallbacks}"
    )
    print(
        f"median costs: reset {statistics.median(resets) * 1e3:.3f} ms, "
        f"search step {statistics.median(searches) * 1e3:.2f} ms (n={len(searches)}), "
        f"click step {statistics.median(clicks) * 1e3:.3f} ms (n={len(clicks)})"
    )

    rng = random.Random(0)
    wins, rewards = 0, []
    for seed in range(n_random):
        env.reset(seed)
        while not env.done:
            _, reward, done, info = env.step(random_valid_action(env, rng))
        wins += info["success"]
        rewards.append(reward)
    print(
        f"random valid actions on {n_random} eval episodes: "
        f"success {wins}/{n_random} = {wins / n_random:.1%}, "
        f"mean reward {statistics.mean(rewards):.3f}"
    )


if __name__ == "__main__":
    {"freeze": freeze, "bench": bench}[sys.argv[1] if len(sys.argv) > 1 else "bench"]()
