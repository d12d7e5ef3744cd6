#!/usr/bin/env bash
# A GRPO variant from each seed's demo SFT model (run.sh's W), alone on the 2-core CPU like the demo's GRPO, then
# evaluated on the same 400 holdout mazes and paired with the demo's GRPO and arm A.
#   NAME=ppo1 SET="algo.ppo_epochs=1 train.steps=110" bash bench/results/2026-12-08-cpu-demo-equal-compute/lever.sh
# W and DEMO_DIR_S: see common.sh.
. "$(dirname "$0")/common.sh"
for S in ${SEEDS:-0 1}; do
  D=$(demo_dir $S)
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  $V train $C model.path=$D/sft-adapter model.init_tiny=null train.seed=$S tracking.enabled=false \
    storage.root=$W/runs$S storage.run_name=$NAME $SET --quiet > $W/$NAME-$S.log 2>&1
  wall=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" $t0 $(date +%s.%N))
  $V eval -c $C --model $D/sft-adapter --adapter $W/runs$S/$NAME/adapter model.init_tiny=null tracking.enabled=false \
    storage.root=$W/runs$S --no-base -n 400 -o $W/eval-$NAME$S > $W/eval-$NAME$S.log 2>&1
  pair --seed $S grpo=$D/eval/grpo/traces.jsonl A=$(ls $W/eval-A$S/*/traces.jsonl) \
    $NAME=$(ls $W/eval-$NAME$S/*/traces.jsonl) > $R/$NAME-paired-seed$S.json
  cp $W/runs$S/$NAME/metrics.jsonl $R/$NAME-metrics-seed$S.jsonl
  python3 - $R/$NAME-paired-seed$S.json "$NAME" "$S" "$wall" <<'P' | tee -a $R/levers.txt
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]} seed {sys.argv[3]} GRPO wall {sys.argv[4]} s: " + "; ".join(
    f"{r['a']} - {r['b']} {100 * r['difference']:+.2f} (p={r['p_value']:.2g})" for r in rows if sys.argv[2] in (r['a'], r['b'])))
P
done
