#!/usr/bin/env bash
# The vLLM engine on one GPU (issue 16): correctness checks, a short training run, and the GRPO
# benchmark with vLLM rollouts side by side with TRL + its colocated vLLM. Every phase has its own
# time limit and writes what it measured to $OUT (default /tmp/gpu-vllm), so a phase that fails or
# runs long costs only itself.
#
#   OUT=DIR bash bench/gpu_vllm.sh checks   # bench/gpu_vllm_checks.py + a 5-step train with vLLM rollouts
#   OUT=DIR bash bench/gpu_vllm.sh bench    # 8B-shape step: vlrl + vLLM (GRPOTrainer.step), decode sweep
#   OUT=DIR bash bench/gpu_vllm.sh bench-trl   # the same workload through TRL + its colocated vLLM, then TRL alone
#   OUT=DIR bash bench/gpu_vllm.sh bench-all   # bench then bench-trl in one command (~8 minutes): the same run
#   OUT=DIR bash bench/gpu_vllm.sh reference   # one GPU's share of configs/qwen3vl-8b-6gpu.yaml, vLLM engine
#   OUT=DIR bash bench/gpu_vllm.sh reference-hf   # the same with the transformers engine
#   OUT=DIR bash bench/gpu_vllm.sh serve    # vlrl serve under load, with swaps
#   OUT=DIR bash bench/gpu_vllm.sh extra    # update memory (issue 17), no vLLM needed
#
# VLRL_BENCH_ARGS adds flags of bench/grpo_bench.py to vlrl's side of bench and bench-all, e.g.
# VLRL_BENCH_ARGS="--compile-blocks false" measures the steps eager (train.compile_blocks is auto: on here).
#
# Every mode but extra first runs .vg/setup.sh, which must make a GPU build of vLLM importable
# (the script puts /tmp/vllm-site first on PYTHONPATH). Wheels in .whl/ (TRL for `bench-trl`) are
# installed into /tmp/site first, e.g.:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
set -uo pipefail
MODE=${1:-checks}
OUT=${OUT:-/tmp/gpu-vllm}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_vllm-$MODE.log") 2>&1
T0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - T0)) s] $*"; }

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false VLLM_LOGGING_LEVEL=WARNING
stamp "$MODE $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [ "$MODE" != extra ]; then
  bash .vg/setup.sh || { echo "vLLM bundle missing: stash .vg0-.vg2 first"; exit 1; }
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/vllm-site:/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"

TINY=/tmp/tiny-ci
M8B=/tmp/m8b

left() { echo $((590 - $(date +%s) + T0)); }   # seconds left of this command's ~10 minutes
vlrl_bench() {  # $1: the first attempt's time limit
  # vlrl's side: GRPOTrainer.step with one local worker and its colocated vLLM engine (what `vlrl train` runs).
  stamp "vlrl, vLLM engine colocated (8B shape)"
  # rollout.sleep_level auto (2 with merged weights); should that fail, the same with level 1, so the
  # call still measures a step.
  local args="--engine vllm --model qwen3vl-8b-shape --model-dir $M8B --warmup 1 --steps 2 --decode-sweep 64,256 \
    --gpu-memory-utilization 0.35 --peak-tflops 790 ${VLRL_BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  timeout "$1" python3 bench/grpo_bench.py $args --out "$OUT/vlrl_vllm.json"
  local rc=$?
  echo "bench exit $rc"
  if [ $rc -ne 0 ] && [ "$(left)" -gt 240 ]; then
    stamp "again with rollout.sleep_level=1"
    # shellcheck disable=SC2086
    timeout "$(left)" python3 bench/grpo_bench.py $args --sleep-level 1 --out "$OUT/vlrl_vllm.json"
    echo "bench (sleep level 1) exit $?"
  fi
}
trl_bench() {
  # TRL with and without vLLM on the same workload and weights; merged with vlrl's side into one table.
  stamp "TRL GRPOTrainer + colocated vLLM, same workload, same GPU"
  timeout "$(( $(left) < 300 ? $(left) : 300 ))" python3 bench/grpo_bench.py --trl-only --compare trl-vllm \
    --model qwen3vl-8b-shape --model-dir $M8B --warmup 1 --steps 2 --gpu-memory-utilization 0.3 --out "$OUT/trl_vllm.json"
  echo "trl-vllm exit $?"
  stamp "TRL GRPOTrainer, transformers generation, same workload, same GPU"
  timeout "$(( $(left) < 240 ? $(left) : 240 ))" python3 bench/grpo_bench.py --trl-only --compare trl \
    --model qwen3vl-8b-shape --model-dir $M8B --warmup 1 --steps 2 --out "$OUT/trl.json"
  echo "trl exit $?"
  local parts="" f
  for f in vlrl_vllm trl_vllm trl; do [ -f "$OUT/$f.json" ] && parts="$parts $OUT/$f.json"; done
  # shellcheck disable=SC2086
  [ -f "$OUT/vlrl_vllm.json" ] && python3 bench/grpo_bench.py --merge $parts --out "$OUT/side_by_side.json"
}
case "$MODE" in
serve)
  stamp "serving: vlrl serve on the GPU (tiny model, two adapters), 32 then 128 clients, a swap in each phase"
  timeout 280 python3 bench/serve_load.py --make-tiny /tmp/serve-bench --clients 32,128 --duration 15 \
    --json "$OUT/serve_load.json"
  echo "serve_load exit $?"
  ;;
checks)
  stamp "engine checks (bf16, vision-tower LoRA)"
  timeout 300 python3 bench/gpu_vllm_checks.py --model-dir $TINY --out "$OUT/checks.json"
  echo "checks exit $?"
  # The tiny model's context is 4096 tokens: 16 px blocks (144 px, 81 image tokens a turn) fit 18 turns.
  stamp "5-step train, 9x9 block maze (reference task shape), vLLM rollouts, one GPU"
  rm -rf /tmp/runs/maze9-vllm
  timeout 240 python3 -m vlrl.cli train configs/ci-tiny.yaml model.path=$TINY env.layout=blocks 'env.sizes=[9]' \
    env.cell_px=16 env.placement=corners env.max_turns=18 env.stop_required=true env.rewards.progress=0.0 \
    rollout.engine=vllm rollout.max_model_len=4096 rollout.max_new_tokens=16 rollout.gpu_memory_utilization=0.3 \
    runtime.backend=local runtime.use_gpu=true model.dtype=bfloat16 model.lora.include_vision=true \
    train.steps=5 train.eval_tasks=8 storage.root=/tmp/runs storage.run_name=maze9-vllm --quiet
  echo "train exit $?"
  cp /tmp/runs/maze9-vllm/metrics.jsonl "$OUT/train_maze9_vllm_metrics.jsonl" 2>/dev/null
  ;;
bench)
  vlrl_bench 400
  ;;
bench-trl)
  trl_bench
  ;;
bench-all)
  # Both sides in one command, one after the other on the same GPU: the same-run comparison.
  vlrl_bench 330
  trl_bench
  ;;
reference|reference-hf)
  # The seed's workload: one GPU's share of configs/qwen3vl-8b-6gpu.yaml through the trainer, vLLM or transformers.
  engine=vllm; [ "$MODE" = reference-hf ] && engine=transformers
  stamp "reference workload (8B shape, 9x9 blocks, 18 turns, group 8, KL), $engine engine"
  timeout 590 python3 bench/reference_step.py --model-dir $M8B --init-tiny qwen3vl-8b-shape --engine $engine \
    --steps 2 --warmup 1 --time-budget-s 540 --out "$OUT/reference_$engine.json"
  echo "reference exit $?"
  ;;
extra)
  # Issue 17: the loss pass's memory and speed at 8B shape, before (legacy) and after (chunked), one
  # workload per command so a slow one costs only itself.
  stamp "update memory, 8B shape, single-turn workload (issue 17)"
  timeout 200 python3 bench/update_memory.py --workload single --out "$OUT/update_memory_single.json"
  stamp "update memory, 8B shape, the 6-GPU config's per-GPU multi-turn share (issue 17)"
  timeout 270 python3 bench/update_memory.py --workload multi --multi-micro 8 --out "$OUT/update_memory_multi.json"
  ;;
esac
stamp "done ($MODE)"
