#!/usr/bin/env bash
# The two follow-ups to run.sh and lever.sh, after both ran (W and DEMO_DIR_S: see common.sh):
#   armA309: seed 1's arm A again, for the 308.9 s the one-epoch GRPO (lever.sh NAME=ppo1) took, not the 270 s
#            of the demo's two-epoch GRPO; paired with that GRPO and the first arm A -> ppo1-armA309-paired-seed1.json
#   lr:      the adopted recipe (ppo1) paired with the two lr 1.5e-3 levers, both seeds -> lr-paired-seedS.json
#   bash bench/results/2026-12-08-cpu-demo-equal-compute/followups.sh armA309|lr
. "$(dirname "$0")/common.sh"
case "${1:?armA309 or lr}" in
armA309)
  D=$(demo_dir 1)
  $V sft $C model.path=$D/sft-adapter model.init_tiny=null train.sft.max_minutes=5.148 train.sft.epochs=50 \
    train.seed=2001 tracking.enabled=false storage.root=$W/runs1 -o $W/A1b --overwrite > $W/A1b.log 2>&1
  $V eval -c $C model.init_tiny=null tracking.enabled=false storage.root=$W/runs1 -n 400 --model $W/A1b \
    -o $W/eval-A1b > $W/eval-A1b.log 2>&1
  pair --seed 1 A309=$(ls $W/eval-A1b/*/traces.jsonl) ppo1=$(ls $W/eval-ppo11/*/traces.jsonl) \
    A=$(ls $W/eval-A1/*/traces.jsonl) > $R/ppo1-armA309-paired-seed1.json
  cp $W/A1b/sft_history.json $R/armA309-seed1-sft_history.json
  ;;
lr)
  for S in 0 1; do
    pair --seed $S ppo1=$(ls $W/eval-ppo1$S/*/traces.jsonl) ppo1lr15=$(ls $W/eval-ppo1lr15$S/*/traces.jsonl) \
      ppo1lr15s135=$(ls $W/eval-ppo1lr15s135$S/*/traces.jsonl) > $R/lr-paired-seed$S.json
  done
  ;;
esac
