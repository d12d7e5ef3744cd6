#!/usr/bin/env bash
# Issue 32, the CPU demo with vision pretraining, walker_random SFT and the esp32ds GRPO recipe (now
# configs/demo-cpu.yaml). Two seeds side by side, one thread each (2-core machine). From the checkout's root:
#   bash bench/results/2026-12-07-cpu-demo-seeing-esp/run.sh
set -u
cd "$(git rev-parse --show-toplevel)"
R=bench/results/2026-12-07-cpu-demo-seeing-esp
for S in 0 1; do
  mkdir -p /tmp/proto_$S
  ( .venv/bin/vlrl demo -c configs/demo-cpu.yaml -o /tmp/proto_$S/demo model.path=/tmp/proto_$S/tiny-demo-ci \
      storage.root=/tmp/proto_$S/runs train.seed=$S runtime.torch_threads=1 > /tmp/proto_$S/log 2>&1
    cp /tmp/proto_$S/demo/demo.json $R/demo-seed$S.json
    cp /tmp/proto_$S/demo/learning_curve.png $R/learning_curve-seed$S.png ) &
done; wait
