#!/usr/bin/env bash
# The 8B-shape GRPO benchmark (issue 10) on one GPU machine: vlrl's fast rollout path and its
# transformers-generate path, TRL side by side, and Ray scaling over the host's GPUs.
#
#   OUT=DIR bash bench/gpu_session.sh lanes        # two GPUs
#   OUT=DIR bash bench/gpu_session.sh sequential   # one GPU
#
# OUT (default /tmp/gpu-session) receives session.log and the JSON of each benchmark; BUDGET (default
# 570 s) caps the whole. Wheels in .whl/ are installed into /tmp/site first (TRL and what it needs,
# where the GPU image lacks them), e.g.:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pydantic pydantic-core \
#     annotated-types typing-inspection
# A Ray install under $BUNDLE (default build/devbundle, with a setup.sh) is set up first when present.
#
# lanes (two GPUs): GPU 0 runs vlrl (fast path, then generate path) while GPU 1 runs TRL and then
# writes the model directory the Ray workers load; then Ray runs 1 and 2 workers. The lanes share
# the host's CPUs, which slows the CPU-bound parts of both sides.
# sequential (one GPU, nothing else running): vlrl fast path, TRL, vlrl fast path with the decode
# step compiled, then the generate path if time is left.
# Every phase has a time limit, so the whole stays under BUDGET and what was measured is in $OUT.
set -uo pipefail
MODE=${1:-lanes}
OUT=${OUT:-/tmp/gpu-session}
BUNDLE=${BUNDLE:-build/devbundle}
BUDGET=${BUDGET:-570}
RAY_RUNS=${RAY_RUNS:-1:8,2:16,2:8}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
T0=$(date +%s)
left() { echo $((BUDGET - $(date +%s) + T0)); }
stamp() { echo "== [$(($(date +%s) - T0)) s] $*"; }

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

stamp "setup $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem --format=csv
if [ -f "$BUNDLE/setup.sh" ]; then bash "$BUNDLE/setup.sh" >/dev/null && chmod -R u+x /tmp/site/ray/core 2>/dev/null; fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH
python3 - <<'EOF'
import importlib
for name in ("torch", "transformers", "peft", "accelerate", "pyarrow", "datasets", "trl", "ray", "pydantic"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except Exception as exc:
        print(f"{name} FAILED: {type(exc).__name__}: {exc}")
EOF
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
stamp "$GPUS GPU(s)"

BENCH="python3 bench/grpo_bench.py --model qwen3vl-8b-shape --warmup 1 --steps 3"
MODEL_DIR=/tmp/qwen3vl-8b-shape

lane_vlrl() {  # vlrl: the fast path (with the rollout-only sweep), then the transformers-generate path
  timeout 220 $BENCH --fast-decode on --decode-sweep 64,256 --out "$OUT/fast.json" 2>&1 | sed -u 's/^/[fast] /'
  timeout 200 $BENCH --fast-decode off --decode-sweep 64,256 --out "$OUT/generate.json" 2>&1 | sed -u 's/^/[generate] /'
}
lane_trl() {  # TRL on the same workload, then the model directory for the Ray workers
  timeout 240 $BENCH --trl-only --out "$OUT/trl.json" 2>&1 | sed -u 's/^/[trl] /'
  timeout 150 python3 bench/ray_scaling.py --model-dir "$MODEL_DIR" --runs "" 2>&1 | sed -u 's/^/[build] /'
}

if [ "$MODE" = sequential ]; then
  export CUDA_VISIBLE_DEVICES=0
  stamp "sequential: vlrl fast path"
  timeout 200 $BENCH --fast-decode on --decode-sweep 64,256 --out "$OUT/fast.json" 2>&1 | sed -u 's/^/[fast] /'
  stamp "sequential: TRL"
  timeout 220 $BENCH --trl-only --out "$OUT/trl.json" 2>&1 | sed -u 's/^/[trl] /'
  python3 bench/grpo_bench.py --merge "$OUT/fast.json" "$OUT/trl.json" --out "$OUT/side_by_side.json"
  stamp "sequential: vlrl fast path, decode step compiled ($(left) s left)"
  timeout $(($(left) - 10)) $BENCH --fast-decode on --compile-decode --decode-sweep 256 --out "$OUT/compiled.json" 2>&1 \
    | grep -v "^\s*$" | sed -u 's/^/[compiled] /'
  if [ "$(left)" -gt 130 ]; then
    stamp "sequential: generate path ($(left) s left)"
    timeout $(($(left) - 10)) $BENCH --fast-decode off --steps 2 --out "$OUT/generate.json" 2>&1 | sed -u 's/^/[generate] /'
  fi
  stamp "done"
  exit 0
fi

if [ "$GPUS" -ge 2 ]; then
  stamp "lanes: GPU 0 vlrl | GPU 1 TRL, model directory"
  (export CUDA_VISIBLE_DEVICES=0; lane_vlrl) &
  a=$!
  (export CUDA_VISIBLE_DEVICES=1; lane_trl) &
  b=$!
  wait $a $b
else
  stamp "one GPU: vlrl, then TRL"
  lane_vlrl
  timeout 240 $BENCH --trl-only --out "$OUT/trl.json" 2>&1 | sed -u 's/^/[trl] /'
fi

stamp "side by side"
if [ -f "$OUT/fast.json" ] && [ -f "$OUT/trl.json" ]; then
  python3 bench/grpo_bench.py --merge "$OUT/fast.json" "$OUT/trl.json" --out "$OUT/side_by_side.json"
fi
[ -f "$OUT/generate.json" ] && python3 bench/grpo_bench.py --merge "$OUT/generate.json" "$OUT/trl.json" 2>/dev/null | tail -n +4

if [ "$GPUS" -ge 2 ] && [ -f "$MODEL_DIR/config.json" ] && [ "$(left)" -gt 120 ]; then
  stamp "Ray scaling ($RAY_RUNS), $(left) s left"
  timeout $(($(left) - 15)) python3 bench/ray_scaling.py --model-dir "$MODEL_DIR" --runs "$RAY_RUNS" \
    --warmup 1 --steps 2 --out "$OUT/ray_scaling.json" 2>&1 | grep -v "^\s*$" | sed -u 's/^/[ray] /'
  ray stop --force >/dev/null 2>&1 || true
fi
stamp "done"
