#!/usr/bin/env bash
# The step-time probes behind the one-epoch choice: 10 GRPO steps each from seed 0's demo SFT model, alone on the
# 2-core CPU (2 threads), no evaluation; the mean of steps 3-10 per phase goes to probes.json, each run's metrics
# to probe-NAME-metrics.jsonl.  bash bench/results/2026-12-08-cpu-demo-equal-compute/probe.sh
# (W and DEMO_DIR_0: see common.sh.) The 2-epoch variants name algo.ppo_epochs=2: the config now has 1.
. "$(dirname "$0")/common.sh"
D=$(demo_dir 0)
VARIANTS=(
  "mb16:algo.ppo_epochs=2"
  "mb32:algo.ppo_epochs=2 algo.micro_batch_size=32"
  "ppo1:algo.ppo_epochs=1"
  "novis:algo.ppo_epochs=2 model.lora.include_vision=false"
  "ppo1m64:algo.ppo_epochs=1 algo.mini_batch_size=64 algo.micro_batch_size=32"
)
for v in "${VARIANTS[@]}"; do
  n=${v%%:*}
  # shellcheck disable=SC2086
  $V train $C model.path=$D/sft-adapter model.init_tiny=null train.steps=10 train.eval_every=0 tracking.enabled=false \
    storage.root=$W/probe storage.run_name=$n ${v#*:} --quiet > $W/probe-$n.log 2>&1
  cp $W/probe/$n/metrics.jsonl $R/probe-$n-metrics.jsonl
done
python3 - $R "${VARIANTS[@]}" <<'P' | tee $R/probes.json
import json, statistics, sys
out = {}
for v in sys.argv[2:]:
    name, overrides = v.split(":", 1)
    rows = [json.loads(line) for line in open(f"{sys.argv[1]}/probe-{name}-metrics.jsonl")][2:]
    keys = ["time/step_s", "time/rollout_s", "time/update_s", "time/optim_s", "time/logprob_s"]
    out[name] = {"overrides": overrides, **{k: round(statistics.mean(r[k] for r in rows), 3) for k in keys}}
print(json.dumps(out, indent=1))
P
