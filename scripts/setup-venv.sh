#!/usr/bin/env bash
# Creates .venv and installs vlrl with everything its demo and tests need (CPU build of torch).
# Re-running is cheap: it reinstalls only when pyproject.toml or this script changed.
# GPU machines: see README "Installing on a GPU machine" (CUDA torch + vLLM instead of the CPU wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "vlrl needs Python 3.11+"' 
stamp=.venv/.vlrl-installed
want=$(cat pyproject.toml scripts/setup-venv.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# The CPU wheel of torch 2.13.0 first: installing vlrl alone would let pip pick a multi-GB CUDA build.
TORCH_SPEC=${VLRL_TORCH:-torch==2.13.0}
.venv/bin/python -m pip install --quiet "$TORCH_SPEC"
.venv/bin/python -m pip install --quiet -e ".[ray,tracking,metrics,serve,test]"
echo "$want" > "$stamp"
echo "vlrl installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
