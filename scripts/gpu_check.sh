#!/usr/bin/env bash
# A GPU check anyone can run on one CUDA GPU, offline (issue 36): the cpu preset's loop on the GPU (plain,
# then under torchrun with FSDP2 and DCP, resumed), and a random-initialised model of the Qwen2.5-1.5B
# architecture for rollout tokens/s, actor-update time, achieved FLOP/s against a matmul peak measured in
# the same run, and peak memory. Prints one table (scripts/gpu_check.py says what each row is); about 5-8
# minutes on one H200. Everything it wrote stays in $OUT (default var/gpu_check/<time>).
#
#   scripts/gpu_check.sh                  # .venv (pip install -e .[gpu]) and the prepared SmolLM2
#   PY=python3 scripts/gpu_check.sh --smollm2-shape DIR   # any Python with torch + transformers + minihack;
#                                         # DIR: SmolLM2's config and tokenizer, random weights of its shape
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${OUT:-var/gpu_check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this check needs a GPU'"
exec "$PY" scripts/gpu_check.py --out "$OUT" "$@"
