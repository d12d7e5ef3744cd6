#!/usr/bin/env bash
# Issue 32, CPU analogue of "never harm a strong start": GRPO from the oracle-SFT adapter (87.25% greedy) of
# 2026-12-07-cpu-demo-capacity-task-diversity (its oracle-lora arm: SFT on the oracle from sftL_0 for 4 minutes,
# LoRA r16; ADA), on the base sftL_0 of 2026-12-06-cpu-demo-seeing-start/long (START). Two GRPO seeds on the one
# start: the t16g4 recipe with end_when_lost (plain), then the same at T 1.0 with a KL anchor to the start
# (anchored). Two runs at a time, one thread each. From the checkout's root. The defaults of ADA and CAP_EVAL are
# where that report's run.sh writes them; this run read them from ADA=/tmp/cap/lora_oracle_0 CAP_EVAL=/tmp/cap/eval-lora.
set -u
cd "$(git rev-parse --show-toplevel)"
START=${START:-/tmp/seeingL}; W=${W:-/tmp/strong}; ADA=${ADA:-/tmp/dense/oracle-lora_0}; CAP_EVAL=${CAP_EVAL:-/tmp/dense/eval-oracle-lora_0}
mkdir -p $W/logs
V=.venv/bin/vlrl; C=configs/demo-cpu.yaml
COMMON="tracking.enabled=false runtime.torch_threads=1 storage.root=$W/runs"
T16G4="rollout.temperature=1.5 algo.step_advantage_weight=1.0 algo.group_size=4 algo.tasks_per_step=16 env.end_when_lost=true"
run() { S=$1; N=$2; shift 2
  $V train $C model.path=$START/sftL_0 model.init_tiny=null $COMMON storage.run_name=${N}_$S train.seed=$S $T16G4 "$@" \
    --init-adapter $ADA --quiet > $W/logs/${N}_$S.log 2>&1
  $V eval -c $C model.path=$START/sftL_0 model.init_tiny=null $COMMON -n 400 --no-base -a $W/runs/${N}_$S/adapter \
    -o $W/eval-${N}_$S > $W/logs/eval-${N}_$S.log 2>&1; }
run 0 fromOracle & run 1 fromOracle & wait
run 0 anchored algo.kl_coef=0.05 rollout.temperature=1.0 & run 1 anchored algo.kl_coef=0.05 rollout.temperature=1.0 & wait
T() { ls $1/*/traces.jsonl; }
PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py oracleSFT=$(T $CAP_EVAL) \
  plain0=$(T $W/eval-fromOracle_0) plain1=$(T $W/eval-fromOracle_1) anchored0=$(T $W/eval-anchored_0) \
  anchored1=$(T $W/eval-anchored_1) armA=$(T $START/eval-A_0) > bench/results/2026-12-07-cpu-demo-strong-start/paired.json
