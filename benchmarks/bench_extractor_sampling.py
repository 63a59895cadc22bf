"""How πϕ's sampling settings change what its distillations are worth: unusable answers and entries by rule.

    python benchmarks/bench_extractor_sampling.py --run RUN_ID [--episodes 64] [--seeds 3]
        [--setting "temperature=0.7,top_p=1.0"] [--setting "temperature=1.0,top_p=0.99"] ...
        [--extractor PATH]   # πϕ's weights (default: the run's extractor model_path)

Replays a real run's recorded training episodes (their turns, goal, outcome and the entry that guided them)
through ``Extractor.distil`` on a vLLM engine with structured outputs, once per setting and sampling seed,
on the same episodes. Prints per setting, as mean over seeds with a 95% t-interval: the share of answers the
parser rejects (what gives πϕ no operation, hence no credit and nothing for CISPO), the share that ran into
``max_new_tokens``, the share rejected as "content repeats itself", operations per answer, and the share of
parsed entries that pass the report's mechanical rule (names an action, a symbol or an object of the env,
not a duplicate of an earlier one; ``trainer.experiments.bank.entry_quality``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.outputs import write_output  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_SETTINGS = (
    "temperature=0.7,top_p=1.0",
    "temperature=1.0,top_p=0.99",
    "temperature=1.0,top_p=0.99,repetition_penalty=1.1",
    "temperature=1.0,top_p=0.99,repetition_penalty=1.2",
)


def parse_setting(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in ("temperature", "top_p", "repetition_penalty"):
            raise SystemExit(f"unknown sampling setting {key!r} in {text!r}")
        out[key.strip()] = float(value)
    return out


def load_requests(run_id: int, n: int, seed: int):
    """``n`` of the run's recorded training episodes, spread over its steps, as distil requests."""
    from experience.models import Experience
    from trainer.extractor.model import DistilRequest
    from trainer.extractor.prompts import Step
    from trainer.store import Entry
    from webapp.models import EpisodeRecord

    records = list(EpisodeRecord.objects.filter(run_id=run_id, kind="train").exclude(turns=[]))
    if not records:
        raise SystemExit(f"run {run_id} has no recorded episodes with turns")
    records = random.Random(seed).sample(records, min(n, len(records)))
    entries = {
        e.id: Entry(e.id, e.scope, e.title, e.content)
        for e in Experience.objects.filter(id__in=[r.experience_id for r in records if r.experience_id])
    }
    requests = []
    for r in records:
        first = r.turns[0]["observation"]
        goal = first.splitlines()[0].removeprefix("Goal:").strip() if first.startswith("Goal:") else r.env
        requests.append(
            DistilRequest(
                episode_id=f"bench-{r.pk}",
                scope=r.env,
                goal=goal,
                steps=tuple(Step(t["observation"], t["action_text"]) for t in r.turns),
                success=r.success,
                reward=r.reward,
                retrieved=entries.get(r.experience_id),
                step=r.step,
            )
        )
    return requests


def measure(extractor, requests) -> dict[str, float]:
    from trainer.experiments.bank import _tokens, entry_quality

    results = extractor.distil(requests)
    unparseable = sum(not r.parsed.ok for r in results)
    capped = sum(len(r.generation.token_ids) >= extractor.max_new_tokens for r in results)
    loops = sum(any("repeats itself" in e for e in r.parsed.errors) for r in results)
    earlier, good, entries = [], 0, 0
    for r in results:
        for op in r.parsed.items:
            if op.kind == "return":
                continue
            entries += 1
            good += entry_quality(op.title, op.content, earlier)["good"]
            earlier.append(_tokens(f"{op.title}\n{op.content}"))
    n = len(results)
    return {
        "unusable": unparseable / n,
        "capped": capped / n,
        "loops": loops / n,
        "entries/answer": entries / n,
        "good": good / entries if entries else 0.0,
        "tokens/answer": sum(len(r.generation.token_ids) for r in results) / n,
    }


def interval(xs: list[float]) -> str:
    from trainer.experiments.stats import t_interval

    iv = t_interval(xs)
    return f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]" if len(xs) > 1 else f"{xs[0]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=int, required=True, help="a run with recorded training episodes")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3, help="sampling seeds per setting")
    parser.add_argument("--setting", action="append", help="temperature=..,top_p=..,repetition_penalty=..")
    parser.add_argument("--extractor", help="πϕ's weights (default: the run's extractor model_path)")
    args = parser.parse_args()

    import django

    django.setup()
    from trainer.config import RunConfig
    from trainer.extractor.model import Extractor
    from trainer.models import load_tokenizer
    from trainer.rollout.base import engine_from_config
    from webapp.models import Run

    cfg = RunConfig.from_dict(Run.objects.get(pk=args.run).config)
    path = args.extractor or cfg.extractor.model_path
    requests = load_requests(args.run, args.episodes, seed=0)
    kv_gib = cfg.extractor.kv_cache_gib or cfg.rollout.kv_cache_gib
    print(
        f"run {args.run}: {len(requests)} episodes ({sum(r.success for r in requests)} successes, "
        f"{sum(r.retrieved is not None for r in requests)} guided by an entry); πϕ {path}; "
        f"max_new_tokens {cfg.extractor.max_new_tokens}; {args.seeds} seeds a setting\n"
    )
    engine = engine_from_config(path, dataclasses.replace(cfg.rollout, kv_cache_gib=kv_gib))
    tokenizer = load_tokenizer(path)
    keys = ("unusable", "capped", "loops", "entries/answer", "good", "tokens/answer")
    print("| setting | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    table = []
    for text in args.setting or DEFAULT_SETTINGS:
        rows = []
        for seed in range(args.seeds):
            engine._rng.seed(seed)  # the same sampling seeds for every setting
            extractor = Extractor(
                engine,
                tokenizer,
                max_new_tokens=cfg.extractor.max_new_tokens,
                max_ops=cfg.extractor.max_ops,
                trajectory_chars=cfg.extractor.trajectory_chars,
                **parse_setting(text),
            )
            rows.append(measure(extractor, requests))
        print(f"| {text} | " + " | ".join(interval([r[k] for r in rows]) for k in keys) + " |", flush=True)
        table.append({"setting": text} | {k: interval([r[k] for r in rows]) for k in keys})
    engine.close()
    print(f"\n(values: mean over {args.seeds} sampling seeds [95% t-interval])")
    figures = {"run": args.run, "episodes": len(requests), "seeds": args.seeds, "extractor": str(path)}
    write_output("extractor-sampling", figures | {"rows": table})


if __name__ == "__main__":
    main()
