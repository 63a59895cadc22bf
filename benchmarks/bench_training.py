"""Rollout throughput of the vLLM and HF engines, and the time breakdown of one actor step.

    python benchmarks/bench_training.py [--episodes 16] [--turns 4] [--max-new-tokens 8] [--repeat 3]
                                        [--dtype native|bfloat16|float32]

Prints a markdown table: env steps/s and generated tokens/s of the episode runner per engine (same
episodes, same sampling seeds; the median of ``--repeat`` batches), then rollout / logprob recompute /
backward / sync seconds of one GRPO step with the vLLM engine. The default env, Room-Random-5x5, gives an
untrained model mixed outcomes, so the step has rows to train (zero-advantage rows are skipped). Figures
depend on the machine's load; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from trainer.actor import ActorUpdate
from trainer.assemble import build_engine
from trainer.checkpoint import Checkpointer
from trainer.config import get_preset
from trainer.loop import TrainingLoop, sample_tasks
from trainer.models import default_model_path, load_causal_lm, load_tokenizer, prepare_default_models
from trainer.report import BaseReporter
from trainer.rollout.base import native_bf16, resolve_dtype
from trainer.rollout.runner import EpisodeRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="MiniHack-Room-Random-5x5")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per rollout batch")
    parser.add_argument("--turns", type=int, default=4, help="turn limit")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--engines", default="vllm,hf")
    parser.add_argument("--repeat", type=int, default=3, help="rollout batches per engine (median)")
    parser.add_argument("--dtype", default="native", help="rollout.dtype (native: this machine's)")
    args = parser.parse_args()

    prepare_default_models(default_model_path())
    cfg = get_preset("cpu").with_overrides(
        **{
            "env": args.env,
            "method": "grpo",
            "tasks_per_step": max(args.episodes // 4, 1),
            "k_rollouts": 4,
            "rollout.temperature": 0.7,
            "rollout.max_new_tokens": args.max_new_tokens,
            "rollout.turn_limit": args.turns,
            "rollout.context_tokens": 1024,
            "rollout.dtype": args.dtype,
        }
    )
    tokenizer = load_tokenizer(cfg.actor.model_path)
    specs = sample_tasks(cfg, step=1)
    print(f"rollout.dtype {args.dtype} = {resolve_dtype(args.dtype)} (native bf16: {native_bf16()})\n")
    print("| engine | episodes | env steps | tokens | rollout s | env steps/s | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    breakdown = None
    for name in args.engines.split(","):
        engine = build_engine(cfg.with_overrides(**{"rollout.engine": name}))
        r = cfg.rollout
        runner = EpisodeRunner(
            engine,
            tokenizer,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            turn_limit=r.turn_limit,
            context_tokens=r.context_tokens,
        )
        runner.run(specs[:2])  # warm the envs and the engine
        runs = sorted((runner.run(specs)[1] for _ in range(args.repeat)), key=lambda st: st.wall_s)
        stats = runs[len(runs) // 2]
        runner.close()
        print(
            f"| {name} | {stats.episodes} | {stats.env_steps} | {stats.generated_tokens} "
            f"| {stats.wall_s:.1f} (median of {len(runs)}) "
            f"| {stats.env_steps / stats.wall_s:.2f} | {stats.generated_tokens / stats.wall_s:.1f} |",
            flush=True,
        )
        if name == "vllm":
            model = load_causal_lm(cfg.actor.model_path)
            actor = ActorUpdate(model, cfg.actor, estimator=cfg.advantage_estimator)
            with tempfile.TemporaryDirectory() as out:
                loop = TrainingLoop(
                    cfg,
                    engine=engine,
                    model=model,
                    tokenizer=tokenizer,
                    out_dir=Path(out),
                    reporter=BaseReporter(),
                    actor=actor,
                    checkpointer=Checkpointer(Path(out), cfg, actor, tokenizer),
                )
                breakdown = loop.train_step(1)
        engine.close()
    if breakdown:
        m = breakdown
        print("\none GRPO step with the vllm engine (seconds):\n")
        print("| rollout | recompute | backward | sync | total | trained tokens | rows trained/skipped |")
        print("|---|---|---|---|---|---|---|")
        print(
            f"| {m['time/rollout_s']:.1f} | {m['time/recompute_s']:.1f} | {m['time/backward_s']:.1f} "
            f"| {m['time/sync_s']:.2f} | {m['time/step_s']:.1f} | {m['actor/tokens']:.0f} "
            f"| {m['actor/sequences']:.0f} / {m['actor/skipped_rows']:.0f} |"
        )


if __name__ == "__main__":
    main()
