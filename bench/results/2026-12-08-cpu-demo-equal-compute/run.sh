#!/usr/bin/env bash
# Issue 32, the demo's equal-compute arm: configs/demo-cpu.yaml as `vlrl demo` runs it (seed S, alone on the
# 2-core CPU, 2 threads), then arm A: full SFT on walker_random continued from the demo's own SFT model for as
# many seconds as the demo's GRPO phase took (train.sft.max_minutes; other transcripts, train.seed 2000+S), alone.
# All three (the demo's SFT start, GRPO, arm A) are then evaluated on the same 400 holdout mazes and paired.
# From the checkout's root:  SEEDS="0 1" bash bench/results/2026-12-08-cpu-demo-equal-compute/run.sh
# W and DEMO_DIR_S: see common.sh.
. "$(dirname "$0")/common.sh"
for S in ${SEEDS:-0 1}; do
  D=$(demo_dir $S)
  if [ ! -f $D/demo.json ]; then
    $V demo -c $C -o $D model.path=$W/tiny-demo-ci-$S storage.root=$W/runs$S train.seed=$S > $W/demo$S.log 2>&1
  fi
  cp $D/demo.json $R/demo-seed$S.json
  MIN=$(python3 -c "import json; print(round(json.load(open('$D/demo.json'))['phase_s']['grpo'] / 60, 3))")
  echo "seed $S: GRPO phase $MIN min -> arm A train.sft.max_minutes=$MIN"
  $V sft $C model.path=$D/sft-adapter model.init_tiny=null train.sft.max_minutes=$MIN train.sft.epochs=50 \
    train.seed=$((2000 + S)) tracking.enabled=false storage.root=$W/runs$S -o $W/A$S --overwrite > $W/A$S.log 2>&1
  cp $W/A$S/sft_history.json $R/armA-seed$S-sft_history.json
  E="-c $C model.init_tiny=null tracking.enabled=false storage.root=$W/runs$S -n 400"
  $V eval $E --model $W/A$S -o $W/eval-A$S > $W/eval-A$S.log 2>&1
  pair --seed $S \
    sft=$(ls $D/eval/sft/traces.jsonl) grpo=$(ls $D/eval/grpo/traces.jsonl) A=$(ls $W/eval-A$S/*/traces.jsonl) \
    > $R/paired-seed$S.json
  cat $R/paired-seed$S.json
done
