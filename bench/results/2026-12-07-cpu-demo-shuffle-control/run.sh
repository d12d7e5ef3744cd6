#!/usr/bin/env bash
# Issue 32, the control arm: GRPO with its advantages shuffled within the batch (algo.shuffle_advantages)
# against the same GRPO, from the sftL starts of 2026-12-06-cpu-demo-seeing-start/long (T 1.5, group 16 x 4;
# GiGPO off: the config refuses shuffling per-turn advantages). Two seeds, one thread each, 80 steps.
set -u
cd "$(git rev-parse --show-toplevel)"
W=${W:-/tmp/ctrl}
V=.venv/bin/vlrl
C=configs/demo-cpu.yaml
COMMON="tracking.enabled=false runtime.torch_threads=1 storage.root=$W/runs"
SET="rollout.temperature=1.5 algo.group_size=16 algo.tasks_per_step=4"
stage() { echo "$(date -u +%FT%TZ) $*" | tee -a $W/logs/stages.txt; }
for ARM in plain shuffled; do
  stage "arm $ARM"
  EXTRA=""; [ $ARM = shuffled ] && EXTRA="algo.shuffle_advantages=true"
  for S in 0 1; do
    ( rm -rf $W/runs/${ARM}_$S
      # shellcheck disable=SC2086
      $V train $C model.path=$W/sftL_$S model.init_tiny=null $COMMON storage.run_name=${ARM}_$S train.seed=$S $SET $EXTRA \
        --quiet > $W/logs/${ARM}_$S.log 2>&1; echo "rc=$?" >> $W/logs/${ARM}_$S.log ) &
  done; wait
done
stage eval
for S in 0 1; do
  ( for ARM in plain shuffled; do
      $V eval -c $C --model $W/sftL_$S --adapter $W/runs/${ARM}_$S/adapter model.init_tiny=null $COMMON --no-base -n 400 \
        -o $W/eval-${ARM}_$S > $W/logs/eval-${ARM}_$S.log 2>&1
    done ) &
done; wait
stage pair
for S in 0 1; do
  PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py \
    sftL=$(ls /tmp/seeingL/eval-sftL_$S/*/traces.jsonl) plain=$(ls $W/eval-plain_$S/*/traces.jsonl) \
    shuffled=$(ls $W/eval-shuffled_$S/*/traces.jsonl) > $W/paired_$S.json 2> $W/logs/pair_$S.log
done
stage done
