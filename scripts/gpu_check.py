"""A GPU check anyone can run on one CUDA GPU, offline (issue 36); ``scripts/gpu_check.sh`` calls it.

Parts, each in its own process with its own time limit, so that one failure or hang leaves the others'
figures (every part's result is written to ``OUT/results.json`` as soon as it ends):

- ``loop``: the ``cpu`` preset (grpo, MiniHack-Room-5x5, SmolLM2-135M) on the GPU for 2 steps: rollouts,
  recompute, update and weight sync on the device, as a run would do them;
- ``fsdp``: the same under ``torchrun --nproc-per-node 1`` (nccl process group, FSDP2 ``fully_shard``,
  DCP checkpoints every step), then resumed from its DCP checkpoint for a third step;
- ``rollout``: a random-initialised model of the Qwen2.5-1.5B architecture built from its config
  (``trainer/model_shapes``, no download): rollout tokens/s, 64 prompts of 256 ids, 256 new ids each;
- ``update``: one actor update (split GRPO, AdamW, bf16 compute over float32 weights, activation
  checkpointing) of that model on 32 sequences of 1,024 ids: time, achieved FLOP/s (6 · parameters · ids)
  against a bf16 matmul peak measured in the same process, and peak memory;
- ``update_fsdp``: the same update under ``torchrun --nproc-per-node 1``: the model sharded with
  ``fully_shard`` (bf16 ``MixedPrecisionPolicy``, per-block activation checkpointing), then its weights
  and optimiser state saved with DCP and loaded into a second model, which must equal the first.

Random weights earn no reward in MiniHack, so the ``loop``/``fsdp`` parts skip their actor updates (every
group's advantage is zero); the two ``update`` parts are where the backward pass runs on the device.

The engine is vLLM where the ``vllm`` package imports, else transformers ``generate`` (the ``hf`` engine);
the table says which. The model of ``loop``/``fsdp`` is the prepared SmolLM2 (``manage.py prepare_models``)
or, with ``--smollm2-shape DIR`` (a folder with SmolLM2's config and tokenizer but no weights: the weights
do not travel to a machine without the package), random weights of the same architecture; the table says
which. ``--small`` shrinks every size for a dry run on a CPU (``--device cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("loop", "fsdp", "rollout", "update", "update_fsdp")
LIMITS_S = {"loop": 150, "fsdp": 300, "rollout": 100, "update": 100, "update_fsdp": 120}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--smollm2-shape", type=Path, help="SmolLM2's config + tokenizer, for random weights")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a dry run on a CPU")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # one part in this process (the driver's child)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.engine != "auto":
        os.environ["GPU_CHECK_ENGINE"] = args.engine
    if args.part:
        result = PART_FUNCTIONS[args.part](args)
        if result is None:  # a rank other than 0
            return 0
        (args.out / f"{args.part}.json").write_text(json.dumps(result, indent=1))
        return 0
    results = {"environment": environment(args)}
    write_results(args.out, results)
    for part in args.parts.split(","):
        results[part] = run_part(part, args)
        write_results(args.out, results)
        print(f"== {part}: {json.dumps(results[part])[:400]}", flush=True)
    table = format_table(results)
    (args.out / "table.txt").write_text(table + "\n")
    print(table)
    return 0


def write_results(out: Path, results: dict) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1))


def run_part(part: str, args: argparse.Namespace) -> dict:
    """``part`` in a child process (``--part``), killed at its time limit; its JSON, or what went wrong."""
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--out",
        str(args.out),
        "--device",
        args.device,
        "--engine",
        args.engine,
        "--part",
        part,
    ]
    if part == "update_fsdp":
        argv[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    if args.smollm2_shape:
        argv += ["--smollm2-shape", str(args.smollm2_shape)]
    if args.small:
        argv.append("--small")
    t0 = time.perf_counter()
    with open(args.out / f"{part}.log", "w") as log:
        try:
            code = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, timeout=LIMITS_S[part]
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    seconds = round(time.perf_counter() - t0, 1)
    result_file = args.out / f"{part}.json"
    if code == 0 and result_file.exists():
        return json.loads(result_file.read_text()) | {"part_s": seconds}
    tail = (args.out / f"{part}.log").read_text(errors="replace").strip().splitlines()[-6:]
    return {"error": f"exit {code} after {seconds} s", "log_tail": tail}


# ---- what ran where -----------------------------------------------------------------------------


def environment(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "engine": engine_name(),
        "device": args.device,
    }
    if args.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "gpu_count": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
        }
        smi = shutil.which("nvidia-smi")
        if smi:
            query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
            env["driver"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    return env


def engine_name() -> str:
    """vllm where it imports, else hf (``--engine`` chooses)."""
    if os.environ.get("GPU_CHECK_ENGINE"):
        return os.environ["GPU_CHECK_ENGINE"]
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or a build for another torch
        return "hf"
    return "vllm"


# ---- loop and fsdp: the product's own training command ---------------------------------------------


def smollm2_folder(args: argparse.Namespace) -> tuple[Path, str]:
    """The prepared SmolLM2, or random weights of its architecture saved beside its config and tokenizer."""
    from trainer.models import default_model_path, is_checkpoint

    if args.smollm2_shape is None and is_checkpoint(default_model_path()):
        return default_model_path(), "SmolLM2-135M-Instruct (prepared weights)"
    if args.smollm2_shape is None:
        raise SystemExit("no prepared SmolLM2 (manage.py prepare_models) and no --smollm2-shape folder")
    dest = args.out / "smollm2-random"
    if not (dest / "config.json").exists():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(args.smollm2_shape)
        if args.small:
            cfg.num_hidden_layers = 2
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).to(torch.float32).save_pretrained(dest, safe_serialization=True)
        for f in args.smollm2_shape.iterdir():
            if f.is_file() and f.name != "config.json" and not (dest / f.name).exists():
                shutil.copy(f, dest / f.name)
    return dest, "random weights of the SmolLM2-135M-Instruct architecture (its weights did not travel)"


def train_command(args: argparse.Namespace, model: Path, run: Path, steps: int, *more: str) -> list[str]:
    sets = {
        "device": args.device,
        "rollout.engine": engine_name(),
        "actor.model_path": model,
        "extractor.model_path": model,
        "eval_every": 0,
        "eval_episodes": 8,
    }
    if args.small:
        sets |= {
            "tasks_per_step": 1,
            "k_rollouts": 4,
            "eval_episodes": 2,
            "rollout.turn_limit": 3,
            "rollout.max_new_tokens": 16,
        }
    argv = [
        "-m",
        "trainer.train",
        "--config",
        "cpu",
        "--method",
        "grpo",
        "--steps",
        str(steps),
        "--out",
        str(run),
    ]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return [*argv, *more]


def step_figures(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("kind", "step") == "step" and "time/step_s" in r]
    return {
        "steps": [r.get("step") for r in steps],
        "step_s": [round(r["time/step_s"], 2) for r in steps],
        "rollout_tokens_per_s": [round(r.get("rollout/tokens_per_s", 0.0)) for r in steps],
        "success": [r.get("rollout/success", r.get("success")) for r in steps],
    }


def part_loop(args: argparse.Namespace) -> dict:
    model, what = smollm2_folder(args)
    run = args.out / "loop-run"
    shutil.rmtree(run, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, *train_command(args, model, run, 2, "--set", "checkpoint_every=0")], check=True
    )
    return {"model": what, "wall_s": round(time.perf_counter() - t0, 1)} | step_figures(run)


def part_fsdp(args: argparse.Namespace) -> dict:
    """1 rank under torchrun: process group, fully_shard and DCP on this device; then a resume."""
    model, what = smollm2_folder(args)
    run = args.out / "fsdp-run"
    shutil.rmtree(run, ignore_errors=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    sharded = ("--set", "nproc=1", "--set", "checkpoint_every=1")
    t0 = time.perf_counter()
    subprocess.run([*torchrun, *train_command(args, model, run, 2, *sharded)], check=True)
    first = time.perf_counter() - t0
    checkpoints = sorted(p.name for p in run.glob("checkpoints/*") if p.is_dir())
    t0 = time.perf_counter()
    subprocess.run(
        [*torchrun, *train_command(args, model, run, 3, *sharded, "--resume", str(run))], check=True
    )
    figures = step_figures(run)
    return {
        "model": what,
        "wall_s_2_steps": round(first, 1),
        "wall_s_resume_1_step": round(time.perf_counter() - t0, 1),
        "checkpoints_after_2_steps": checkpoints,
        "dcp_files": sorted(p.name for p in run.rglob("*.distcp"))[:4],
        "steps_recorded": figures["steps"],
        "step_s": figures["step_s"],
    }


# ---- rollout and update: a model of the Qwen2.5-1.5B architecture ----------------------------------


def qwen_folder(args: argparse.Namespace) -> Path:
    """Random bf16 weights of the Qwen2.5-1.5B architecture (``--small``: 2 layers of width 256)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dest = args.out / "qwen1.5b-random"
    if (dest / "config.json").exists():
        return dest
    shape = json.loads((ROOT / "trainer/model_shapes/Qwen2.5-1.5B-Instruct.json").read_text())
    drop = ("architectures", "model_type", "torch_dtype")
    fields = {k: v for k, v in shape.items() if not k.startswith("_") and k not in drop}
    if args.small:
        fields |= {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "vocab_size": 4096,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(Qwen2Config(**fields, max_position_embeddings=4096, rope_theta=1e6))
    model.to(torch.bfloat16).save_pretrained(dest, safe_serialization=True)
    return dest


def part_rollout(args: argparse.Namespace) -> dict:
    import torch

    from trainer.rollout.base import GenerationRequest, make_engine

    path = qwen_folder(args)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    n, prompt, new = (8, 32, 16) if args.small else (64, 256, 256)
    gen = torch.Generator().manual_seed(0)
    requests = [
        GenerationRequest(
            torch.randint(0, vocab, (prompt,), generator=gen).tolist(),
            max_new_tokens=new,
            min_new_tokens=new,
            seed=i,
        )
        for i in range(n)
    ]
    name = engine_name()
    options = {"dtype": "bfloat16"} if name == "vllm" else {"dtype": "bfloat16", "device": args.device}
    if name == "vllm":
        options |= {"max_model_len": 1024, "kv_cache_memory_bytes": 8 * 2**30, "seed": 0, "sleep_mode": True}
    engine = make_engine(name, path, **options)
    try:
        engine.generate(requests[:8])  # warm-up (kernels, graph capture)
        t0 = time.perf_counter()
        outputs = engine.generate(requests)
        seconds = time.perf_counter() - t0
        sleep = sleep_figures(engine, requests[:8], outputs[:8], args.device)
    finally:
        engine.close()
    tokens = sum(len(o.token_ids) for o in outputs)
    return sleep | {
        "engine": name,
        "prompts": n,
        "prompt_ids": prompt,
        "new_ids": new,
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds),
    }


def sleep_figures(engine, requests, before, device: str) -> dict:
    """The GPU memory ``engine.asleep()`` gives back (vLLM's sleep mode, as the loop uses it around each actor
    update) and whether the woken engine samples the same completions for the same seeds."""
    import torch

    if not device.startswith("cuda"):
        return {}
    free = lambda: torch.cuda.mem_get_info()[0] / 2**30  # noqa: E731
    awake = free()
    with engine.asleep():
        asleep = free()
    again = engine.generate(requests)
    same = [g.token_ids for g in again] == [g.token_ids for g in before]
    return {"sleep_freed_gib": round(asleep - awake, 2), "same_after_wake": same}


def part_update(args: argparse.Namespace) -> dict | None:
    """The actor update, plain (one process) or, launched by torchrun, sharded; then a DCP round trip."""
    import torch

    from trainer import parallel
    from trainer.actor import ActorUpdate
    from trainer.config import ActorConfig
    from trainer.models import load_causal_lm
    from trainer.rollout.runner import Episode, EpisodeSpec, Segment

    path = qwen_folder(args)  # one process, or the one rank of torchrun --nproc-per-node 1
    placement = parallel.init_distributed(args.device)
    model = parallel.parallelize(load_causal_lm(path), placement, activation_checkpointing=True)
    n_params = sum(parallel.full_tensor(p.detach()).numel() for p in model.parameters())
    vocab = model.config.vocab_size
    n, length, prompt = (8, 64, 16) if args.small else (32, 1024, 256)
    gen = torch.Generator().manual_seed(1)
    episodes = []
    for i in range(n):  # task instances of 4 rollouts, half guided, mixed rewards; engine log-probs ~ uniform
        ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
        seg = Segment(
            prompt_ids=ids[:prompt],
            response_ids=ids[prompt:],
            mask=[1] * (length - prompt),
            engine_logprobs=[-11.9] * (length - prompt),
        )
        reward = float(i % 2)
        spec = EpisodeSpec("check", seed=i // 4, group=i // 4, guided=i % 4 < 2)
        episodes.append(Episode(spec, "", "", None, [], [seg], reward, reward > 0, False, [0], 0.0))
    cfg = ActorConfig(lr=1e-6, micro_batch_size=8, gradient_checkpointing=True)
    update = ActorUpdate(model, cfg, estimator="grpo_split", max_engine_diff=1e9)  # random engine: no check
    cuda = placement.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    update.step(episodes)  # warm-up (allocator, kernels)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        metrics = update.step(episodes)
        sync()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tokens = n * length
    size = 1024 if args.small else 8192
    a = torch.randn(size, size, device=placement.device, dtype=torch.bfloat16 if cuda else torch.float32)
    b = torch.randn_like(a)
    a @ b
    sync()
    mm = []
    for _ in range(10):
        t0 = time.perf_counter()
        a @ b
        sync()
        mm.append(time.perf_counter() - t0)
    peak = 2 * size**3 / statistics.median(mm)
    flops = 6 * n_params * tokens / step_s  # activation checkpointing's second forward is not counted
    memory = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    result = {"sharded": parallel.is_sharded(model), "world_size": placement.world_size}
    if placement.distributed:
        result["dcp_round_trip_equal"] = dcp_round_trip(args, model, update.optimizer, path, placement)
        if not parallel.is_main():
            return None
    return result | {
        "params": n_params,
        "tokens": tokens,
        "step_s": round(step_s, 3),
        "step_s_all": [round(t, 3) for t in times],
        "tflops": round(flops / 1e12, 2),
        "matmul_peak_tflops": round(peak / 1e12, 1),
        "fraction_of_peak": round(flops / peak, 3),
        "peak_memory_gib": memory and round(memory, 2),
        "loss_finite": all(v == v for v in metrics.values() if isinstance(v, float)),
    }


def dcp_round_trip(args, model, optimizer, path: Path, placement) -> bool:
    """Save weights and optimiser state with DCP, load them into a freshly sharded model: equal?"""
    import torch

    from trainer import parallel
    from trainer.checkpoint import load_sharded, save_sharded
    from trainer.models import load_causal_lm

    folder = args.out / "update-dcp"
    save_sharded(folder, model, optimizer)
    other = parallel.parallelize(load_causal_lm(path), placement, activation_checkpointing=True)
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=1e-6, weight_decay=0.0)
    load_sharded(folder, other, other_optimizer)
    same = all(
        torch.equal(parallel.full_tensor(a.detach()), parallel.full_tensor(b.detach()))
        for a, b in zip(model.parameters(), other.parameters(), strict=True)
    )
    moments = [s["exp_avg"] for s in other_optimizer.state.values()]
    return same and len(moments) == len(list(other.parameters()))


PART_FUNCTIONS = {
    "loop": part_loop,
    "fsdp": part_fsdp,
    "rollout": part_rollout,
    "update": part_update,
    "update_fsdp": part_update,
}


# ---- the table ------------------------------------------------------------------------------------


def format_table(results: dict) -> str:
    env = results["environment"]
    rows = [
        (
            "device",
            f"{env.get('gpu', env['device'])} ({env.get('gpu_memory_gib', '?')} GiB), driver "
            f"{env.get('driver', '?')}, torch {env['torch']}, transformers {env['transformers']}",
        ),
        ("rollout engine", env["engine"]),
    ]
    for part in PARTS:
        r = results.get(part)
        if r is None:
            continue
        if "error" in r:
            rows.append((part, f"FAILED: {r['error']}: {(r.get('log_tail') or [''])[-1][:160]}"))
            continue
        rows += PART_ROWS[part](r)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


PART_ROWS = {
    "loop": lambda r: [
        ("loop: cpu preset, grpo, 2 steps", f"{r['wall_s']} s wall ({r['model']})"),
        ("loop: step s", " / ".join(map(str, r["step_s"]))),
        ("loop: rollout tokens/s", " / ".join(map(str, r["rollout_tokens_per_s"]))),
    ],
    "fsdp": lambda r: [
        (
            "fsdp: torchrun 1 rank, FSDP2, DCP each step",
            f"2 steps {r['wall_s_2_steps']} s; resumed for step 3 in "
            f"{r['wall_s_resume_1_step']} s; steps recorded {r['steps_recorded']}",
        ),
        (
            "fsdp: checkpoints",
            f"{r['checkpoints_after_2_steps']} ({', '.join(r['dcp_files']) or 'no .distcp'})",
        ),
    ],
    "rollout": lambda r: [
        (
            f"Qwen2.5-1.5B shape: rollout tokens/s ({r['engine']})",
            f"{r['tokens_per_s']} ({r['prompts']} x {r['new_ids']} new after {r['prompt_ids']}, bf16)",
        ),
        (
            "vLLM sleep mode (around each actor update)",
            f"{r['sleep_freed_gib']} GiB freed; same completions after waking: {r['same_after_wake']}"
            if "sleep_freed_gib" in r
            else "not available (no vLLM on CUDA)",
        ),
    ],
    "update_fsdp": lambda r: [
        (
            "the same update, torchrun 1 rank, FSDP2",
            f"{r['step_s']} s, {r['tflops']} TFLOP/s, peak "
            f"{r['peak_memory_gib']} GiB; DCP round trip equal: {r['dcp_round_trip_equal']}",
        ),
    ],
    "update": lambda r: [
        ("Qwen2.5-1.5B shape: actor update s", f"{r['step_s']} ({r['tokens']} ids; runs {r['step_s_all']})"),
        (
            "achieved TFLOP/s (6 N T)",
            f"{r['tflops']} of a {r['matmul_peak_tflops']} matmul peak = {r['fraction_of_peak']:.1%}",
        ),
        ("actor update peak memory GiB", str(r["peak_memory_gib"])),
    ],
}


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
