#!/usr/bin/env bash
# The vLLM lane: sets up .venv-vllm (the CPU build of vLLM, scripts/setup-vllm-venv.sh) and runs
# the tests marked `vllm` in it; prints how long the lane took. Arguments replace `tests/` (e.g. one
# test file, or -k EXPR tests/).
# A vLLM that does not import (or that vlrl does not support) fails the lane, it is never a skip:
# the check below stops the lane first, and in the lane (VLRL_VLLM_LANE=1) a vllm test that would
# skip fails instead (tests/vllm_lane.py).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup-vllm-venv.sh
setup_done=$(date +%s)
# In-process engine core (fast start, in-memory LoRA sync); never reach a model hub.
export VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLRL_VLLM_LANE=1
if ! .venv-vllm/bin/python -c "from vlrl.rollout.vllm_engine import import_vllm; print('vLLM', import_vllm().__version__)"; then
  echo "vLLM lane: vLLM does not import in .venv-vllm (above); failing the lane" >&2
  exit 1
fi
status=0
.venv-vllm/bin/python -m pytest -q -m vllm "${@:-tests/}" || status=$?
end=$(date +%s)
echo "vLLM lane: $((end - start)) s (set-up $((setup_done - start)) s, tests $((end - setup_done)) s), exit $status"
exit $status
