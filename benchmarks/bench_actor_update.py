"""One actor update with and without the separate π_old recompute, on the same batch (issue 13, §3).

    python benchmarks/bench_actor_update.py [--env MiniHack-Room-Random-5x5] [--tasks 4] [--repeat 3]

Rolls out one real batch (vLLM, the cpu preset's sampling), then times ``ActorUpdate.step`` on it from the
same starting weights and optimiser state, alternating the two settings ``--repeat`` times each: the old
way (``recompute_old_logprobs=true``: a no-grad forward over every trained row, then the training forward)
and the new one (π_old = the training forward's detached log-probs). Prints the median seconds of each, their
ratio, and the largest difference between the weights the two produce (one optimiser step per batch makes
π_old = π_θ, so they must agree up to float noise).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainer.actor import ActorUpdate
from trainer.assemble import build_engine
from trainer.config import get_preset
from trainer.loop import sample_tasks
from trainer.models import default_model_path, load_causal_lm, load_tokenizer, prepare_default_models
from trainer.rollout.runner import EpisodeRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="MiniHack-Room-Random-5x5")
    parser.add_argument("--tasks", type=int, default=4, help="task instances (× K = 8 rollouts)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    prepare_default_models(default_model_path())
    cfg = get_preset("cpu").with_overrides(
        env=args.env,
        method="grpo",
        tasks_per_step=args.tasks,
        **{"rollout.temperature": 0.7, "rollout.max_new_tokens": 8, "rollout.kv_cache_gib": 2.0},
    )
    model = load_causal_lm(cfg.actor.model_path)
    engine = build_engine(cfg)
    r = cfg.rollout
    runner = EpisodeRunner(
        engine,
        load_tokenizer(cfg.actor.model_path),
        temperature=r.temperature,
        max_new_tokens=r.max_new_tokens,
        turn_limit=r.turn_limit,
        context_tokens=r.context_tokens,
    )
    episodes, stats = runner.run(sample_tasks(cfg, 1))
    runner.close()
    engine.close()
    print(
        f"batch: {len(episodes)} episodes, {stats.generated_tokens} generated tokens, "
        f"success {sum(e.success for e in episodes) / len(episodes):.2f}\n"
    )

    start = {k: v.clone() for k, v in model.state_dict().items()}
    times: dict[bool, list[float]] = {True: [], False: []}
    after: dict[bool, dict[str, torch.Tensor]] = {}
    for _ in range(args.repeat):
        for recompute in (True, False):
            model.load_state_dict(start)
            actor_cfg = cfg.actor.with_overrides(recompute_old_logprobs=recompute)
            actor = ActorUpdate(model, actor_cfg, estimator=cfg.advantage_estimator)
            t0 = time.perf_counter()
            m = actor.step(episodes)
            times[recompute].append(time.perf_counter() - t0)
            after[recompute] = {k: v.clone() for k, v in model.state_dict().items()}
    old, new = statistics.median(times[True]), statistics.median(times[False])
    diff = max(float((after[True][k] - after[False][k]).abs().max()) for k in start)
    moved = max(float((after[False][k] - start[k]).abs().max()) for k in start)
    runs = {k: ", ".join(f"{t:.1f}" for t in v) for k, v in times.items()}
    print(f"| setting | median s (of {args.repeat}) | runs |")
    print("|---|---|---|")
    print(f"| recompute π_old (before) | {old:.1f} | {runs[True]} |")
    print(f"| π_old from the training forward (now) | {new:.1f} | {runs[False]} |")
    print(
        f"\nratio now/before: {new / old:.2f}; rows {m['actor/sequences']:.0f}, "
        f"tokens {m['actor/tokens']:.0f}"
    )
    print(f"largest weight difference between the two updates: {diff:.2e} (largest change: {moved:.2e})")


if __name__ == "__main__":
    main()
