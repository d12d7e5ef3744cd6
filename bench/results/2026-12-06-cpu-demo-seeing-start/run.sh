#!/usr/bin/env bash
# Issue 32, CPU demo: does a vision tower that already SEES the maze (dense labels: walls, agent,
# goal, open moves; `vlrl model pretrain-vision`, no paths, no actions) let GRPO go past the walker
# it imitated? Shared start per seed: random "ci" model -> vision pretraining -> SFT on the walker
# (the demo's SFT, loss target 0.27). Arm B: GRPO from that start, the demo's own recipe
# (configs/demo-cpu.yaml: T 0.6, group 8 x 8 tasks, 2 epochs, lr 1e-3 cosine, 80 steps; T 1.5 left
# this shorter SFT's samples all invalid). Arm A: the same SFT continued for arm B's wall time. Greedy evaluation of the start,
# both arms and (from the same traces) the walker on 400 holdout mazes, paired McNemar.
# Two seeds side by side, one thread each (2-core machine). From the checkout's root:
#   bash bench/results/2026-12-06-cpu-demo-seeing-start/run.sh
#   W=/tmp/seeingL LONG=1 B_SET="rollout.temperature=1.5 algo.step_advantage_weight=1.0 algo.group_size=16 \
#     algo.tasks_per_step=4" bash bench/results/2026-12-06-cpu-demo-seeing-start/run.sh
set -u
cd "$(git rev-parse --show-toplevel)"
W=${W:-/tmp/seeing}
SEEDS=${SEEDS:-0 1}
mkdir -p $W/logs
V=.venv/bin/vlrl
C=configs/demo-cpu.yaml
COMMON="tracking.enabled=false runtime.torch_threads=1 storage.root=$W/runs"
stage() { echo "$(date -u +%FT%TZ) $*" | tee -a $W/logs/stages.txt; }
wall() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$1" "$(date +%s.%N)"; }

[ -d $W/tiny-demo-ci ] || $V model init-tiny $W/tiny-demo-ci --size ci --seed 0 > $W/logs/init-tiny.log 2>&1

stage seeing
for S in $SEEDS; do
  [ -f $W/seeing_$S/model.safetensors ] && continue  # a rerun keeps the stages it has
  ( t0=$(date +%s.%N)
    $V model pretrain-vision $C model.path=$W/tiny-demo-ci model.init_tiny=null runtime.torch_threads=1 \
      train.seed=$S train.vision_pretrain.steps=300 train.vision_pretrain.eval_every=100 -o $W/seeing_$S \
      > $W/logs/seeing_$S.log 2>&1
    wall $t0 > $W/logs/seeing_$S.wall ) &
done; wait

stage sft0
for S in $SEEDS; do
  [ -f $W/sft0_$S/vlrl_sft.json ] && continue
  ( t0=$(date +%s.%N)
    $V sft $C model.path=$W/seeing_$S model.init_tiny=null train.seed=$S $COMMON -o $W/sft0_$S > $W/logs/sft0_$S.log 2>&1
    wall $t0 > $W/logs/sft0_$S.wall ) &
done; wait

# LONG=1: the start is sft0 continued for 5 more epochs without a loss target (sftL, as in
# 2026-12-06-cpu-demo-equal-compute-t15g16), and B_SET (e.g. the T 1.5 GiGPO recipe) goes to arm B.
START=sft0
if [ -n "${LONG:-}" ]; then
  START=sftL
  stage sftL
  for S in $SEEDS; do
    [ -f $W/sftL_$S/vlrl_sft.json ] && continue
    ( t0=$(date +%s.%N)
      $V sft $C model.path=$W/sft0_$S model.init_tiny=null train.sft.target_loss=null train.sft.epochs=5 \
        train.seed=$((1000+S)) $COMMON -o $W/sftL_$S > $W/logs/sftL_$S.log 2>&1
      wall $t0 > $W/logs/sftL_$S.wall ) &
  done; wait
fi

stage armB
for S in $SEEDS; do
  ( t0=$(date +%s.%N)
    rm -rf $W/runs/B_$S
    # shellcheck disable=SC2086
    $V train $C model.path=$W/${START}_$S model.init_tiny=null $COMMON storage.run_name=B_$S \
      train.seed=$S ${B_SET:-} --quiet > $W/logs/B_$S.log 2>&1
    echo "rc=$?" >> $W/logs/B_$S.log
    wall $t0 > $W/logs/B_$S.wall ) &
done; wait

stage armA
for S in $SEEDS; do
  MIN=$(python3 -c "print(round(float(open('$W/logs/B_$S.wall').read()) / 60, 3))")
  echo "seed $S: arm B $(cat $W/logs/B_$S.wall) s -> train.sft.max_minutes=$MIN" | tee -a $W/logs/stages.txt
  ( t0=$(date +%s.%N)
    $V sft $C model.path=$W/${START}_$S model.init_tiny=null train.sft.max_minutes=$MIN train.sft.target_loss=null \
      train.sft.epochs=50 train.seed=$((2000+S)) $COMMON -o $W/A_$S > $W/logs/A_$S.log 2>&1
    echo "rc=$?" >> $W/logs/A_$S.log
    wall $t0 > $W/logs/A_$S.wall ) &
done; wait

stage eval
for S in $SEEDS; do
  ( $V eval -c $C --model $W/${START}_$S model.init_tiny=null $COMMON -n 400 -o $W/eval-${START}_$S \
      > $W/logs/eval-${START}_$S.log 2>&1
    $V eval -c $C --model $W/A_$S model.init_tiny=null $COMMON -n 400 -o $W/eval-A_$S > $W/logs/eval-A_$S.log 2>&1
    $V eval -c $C --model $W/${START}_$S --adapter $W/runs/B_$S/adapter model.init_tiny=null $COMMON --no-base -n 400 \
      -o $W/eval-B_$S > $W/logs/eval-B_$S.log 2>&1
  ) &
done; wait

stage pair
for S in $SEEDS; do
  PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py \
    $START=$(ls $W/eval-${START}_$S/*/traces.jsonl) A=$(ls $W/eval-A_$S/*/traces.jsonl) B=$(ls $W/eval-B_$S/*/traces.jsonl) \
    > $W/paired_$S.json 2> $W/logs/pair_$S.log
done
stage done
