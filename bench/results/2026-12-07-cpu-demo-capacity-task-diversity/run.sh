#!/usr/bin/env bash
# Issue 32, CPU demo: what limits GRPO from the walker-level start sftL (2026-12-06-cpu-demo-seeing-start/long)?
# 1. Capacity: SFT on the ORACLE from sftL for 4 minutes, LoRA (the GRPO adapter's shape) and full weights.
# 2. Dense per-turn credit: the progress term weighted like success, GiGPO discount 0.5, T 1.5 and T 1.0.
# 3. More PPO epochs (4), and more tasks per batch (16 tasks x group 4 instead of 4 x 16; same 64 episodes).
# The second seed ran the t16g4 arm only (S=1). Expects sftL_S in $START (W=/tmp/seeingL of the seeing-start report). From the checkout's root.
set -u
cd "$(git rev-parse --show-toplevel)"
START=${START:-/tmp/seeingL}; W=${W:-/tmp/dense}; S=${S:-0}
mkdir -p $W/logs
V=.venv/bin/vlrl; C=configs/demo-cpu.yaml
COMMON="tracking.enabled=false runtime.torch_threads=1 storage.root=$W/runs"
M="model.path=$START/sftL_$S model.init_tiny=null"
SFT="train.sft.demonstrator=oracle train.sft.target_loss=null train.sft.epochs=50 train.sft.max_minutes=4 train.seed=3000"
$V sft $C $M train.sft.mode=lora train.sft.lr=1e-3 $SFT $COMMON -o $W/oracle-lora_$S > $W/logs/oracle-lora_$S.log 2>&1 &
$V sft $C $M train.sft.mode=full $SFT $COMMON -o $W/oracle-full_$S > $W/logs/oracle-full_$S.log 2>&1 &
wait
T15="rollout.temperature=1.5 algo.step_advantage_weight=1.0"
DENSE="$T15 algo.group_size=16 algo.tasks_per_step=4 env.rewards.progress=1.0 algo.step_discount=0.5"
run() { $V train $C $M $COMMON storage.run_name=$1_$S train.seed=$S ${@:2} --quiet > $W/logs/$1_$S.log 2>&1; }
run dT15 $DENSE & run dT10 $DENSE rollout.temperature=1.0 & wait
run ep4 $T15 algo.group_size=16 algo.tasks_per_step=4 algo.ppo_epochs=4 & run t16g4 $T15 algo.group_size=4 algo.tasks_per_step=16 & wait
ev() { $V eval -c $C $M $COMMON -n 400 "$@"; }
ev --no-base -a $W/oracle-lora_$S -o $W/eval-oracle-lora_$S > $W/logs/eval-oracle-lora_$S.log 2>&1
$V eval -c $C --model $W/oracle-full_$S model.init_tiny=null $COMMON -n 400 -o $W/eval-oracle-full_$S > $W/logs/eval-oracle-full_$S.log 2>&1
for A in dT15 dT10 ep4 t16g4; do ev --no-base -a $W/runs/${A}_$S/adapter -o $W/eval-${A}_$S > $W/logs/eval-${A}_$S.log 2>&1; done
# The train split (greedy): sftL, the dense-credit arm and the shuffle control's plain arm (CTRL), and the oracle-SFT model.
CTRL=${CTRL:-/tmp/ctrl}
ev --split train --force -a $W/runs/dT15_$S/adapter -a $CTRL/runs/plain_$S/adapter -o $W/eval-train_$S > $W/logs/eval-train_$S.log 2>&1
$V eval -c $C --model $W/oracle-full_$S model.init_tiny=null $COMMON --split train --force -n 400 -o $W/eval-train-oracle_$S \
  > $W/logs/eval-train-oracle_$S.log 2>&1
T() { ls $1/*/traces.jsonl; }
PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py sftL=$(T $START/eval-sftL_$S) \
  armA=$(T $START/eval-A_$S) oracleLoRA=$(T $W/eval-oracle-lora_$S) oracleFull=$(T $W/eval-oracle-full_$S) \
  dT15=$(T $W/eval-dT15_$S) dT10=$(T $W/eval-dT10_$S) ep4=$(T $W/eval-ep4_$S) t16g4=$(T $W/eval-t16g4_$S) \
  plain=$(T $CTRL/eval-plain_$S) > $W/paired_$S.json
# seed1-paired.json was the same call with sftL, armA, t16g4 and plain only (S=1 ran the t16g4 arm alone).
