#!/usr/bin/env bash
# Issue 32, CPU demo (3x3 mazes, 6 turns): other demonstrators, the clip, replaying winners, and how much oracle
# SFT it takes to reach what GRPO reaches. Every GRPO arm is the exploring-starts report's best recipe (esp32ds:
# exploring starts, T 1.0, 32 tasks x group 2, dynamic sampling, GiGPO w1, 80 steps, env.end_when_lost=true).
# Two runs at a time, one thread each (2-core machine). From the checkout's root:
#   bash bench/results/2026-12-07-cpu-demo-volume-bound/run.sh
# SEEING: the seeing-start report's W (its vision-pretrained seeing_S and walker-SFT sftL_S, eval-A_S).
set -u
cd "$(git rev-parse --show-toplevel)"
W=${W:-/tmp/wr}; SEEING=${SEEING:-/tmp/seeingL}; R=bench/results/2026-12-07-cpu-demo-volume-bound
mkdir -p $W/logs
V=.venv/bin/vlrl; C=configs/demo-cpu.yaml
COMMON="tracking.enabled=false runtime.torch_threads=1 storage.root=$W/runs"
ES="algo.exploring_starts=true rollout.temperature=1.0 algo.group_size=2 algo.tasks_per_step=32 algo.dynamic_sampling=true algo.step_advantage_weight=1.0"
ev() { $V eval -c $C $COMMON -n 400 "$@"; }
# GRPO from START (a full model) with the esp32ds recipe plus "$@", then the greedy evaluation of its adapter.
grpo() { START=$1; N=$2; shift 2
  t0=$(date +%s)
  $V train $C model.path=$START model.init_tiny=null $COMMON storage.run_name=$N train.seed=${N##*_} \
    env.end_when_lost=true $ES "$@" --quiet > $W/logs/$N.log 2>&1
  echo "rc=$? wall=$(( $(date +%s) - t0 ))" >> $W/logs/$N.log
  ev model.path=$START model.init_tiny=null --no-base -a $W/runs/$N/adapter -o $W/eval-$N > $W/logs/eval-$N.log 2>&1; }

# 1. The demonstrators' own success, no model (first 400 holdout mazes, 6 and 5 turns).
PYTHONPATH=src .venv/bin/python $R/demonstrator_success.py

# 2. Starts on the other two walkers: SFT (full weights) from the vision-pretrained seeing_S, no loss target.
start() { D=$1; EPISODES=$2; TAG=$3
  for S in 0 1; do
    ( $V sft $C model.path=$SEEING/seeing_$S model.init_tiny=null train.sft.demonstrator=$D \
        train.sft.target_loss=null train.sft.episodes=$EPISODES train.sft.epochs=2 train.seed=$S $COMMON \
        -o $W/sft${TAG}_$S > $W/logs/sft${TAG}_$S.log 2>&1
      ev model.path=$W/sft${TAG}_$S model.init_tiny=null -o $W/eval-sft${TAG}_$S > $W/logs/eval-sft${TAG}_$S.log 2>&1 ) &
  done; wait; }
start walker_random 8192 R
start walker_blind 4096 B

# 2b. How sure the walker_random start is of its first move, beside sftL_0 (ES_W: the exploring-starts report's W).
XR=bench/results/2026-12-07-cpu-demo-exploring-starts
PYTHONPATH=src .venv/bin/python $XR/first_move_probs.py $W/sftR_0 none 400 > $W/probs-sftR_0.json
PYTHONPATH=src .venv/bin/python $XR/summary.py sftR_0=$W/probs-sftR_0.json sftL_0=${ES_W:-/tmp/es}/probe/probs-start.json \
  > $R/first_move_probs-sftR_0.json

# 3. GRPO from each start (both seeds), and arm A for walker_random: its SFT continued for arm B's wall time.
grpo $W/sftR_0 resp_0 & grpo $W/sftR_1 resp_1 & wait
grpo $W/sftB_0 Besp_0 & grpo $W/sftB_1 Besp_1 & wait
# the walker_random starts without exploring starts (ES minus algo.exploring_starts)
grpo $W/sftR_0 rnat_0 algo.exploring_starts=false & grpo $W/sftR_1 rnat_1 algo.exploring_starts=false & wait
for S in 0 1; do
  MIN=$(python3 -c "print(round($(grep -o 'wall=[0-9]*' $W/logs/resp_$S.log | cut -d= -f2) / 60, 3))")
  ( $V sft $C model.path=$W/sftR_$S model.init_tiny=null train.sft.demonstrator=walker_random train.sft.max_minutes=$MIN \
      train.sft.target_loss=null train.sft.episodes=4096 train.sft.epochs=50 train.seed=$((2000+S)) $COMMON -o $W/AR_$S \
      > $W/logs/AR_$S.log 2>&1
    ev model.path=$W/AR_$S model.init_tiny=null -o $W/eval-AR_$S > $W/logs/eval-AR_$S.log 2>&1 ) &
done; wait

# 4. From the walker start sftL_0: no upper clip (eps_high 10); and oracle SFT (the capacity report's LoRA recipe)
#    for 1 and 0.5 minutes instead of 4 (run one after the other, beside the clip arm).
grpo $SEEING/sftL_0 Lhi_0 algo.eps_high=10 &
( for M in 1 0.5; do
    $V sft $C model.path=$SEEING/sftL_0 model.init_tiny=null train.sft.mode=lora train.sft.lr=1e-3 \
      train.sft.demonstrator=oracle train.sft.target_loss=null train.sft.epochs=50 train.sft.max_minutes=$M \
      train.seed=3000 $COMMON -o $W/osft${M}_0 > $W/logs/osft${M}_0.log 2>&1
    ev model.path=$SEEING/sftL_0 model.init_tiny=null --no-base -a $W/osft${M}_0 -o $W/eval-osft${M}_0 \
      > $W/logs/eval-osft${M}_0.log 2>&1
  done ) & wait

# 5. Replaying each step's winning episodes (positive episode advantage) in the next 2 or 4 updates:
#    needs replay-winners.patch (VLRL_REPLAY_STEPS); main does not carry it.
# git apply $R/replay-winners.patch
# VLRL_REPLAY_STEPS=2 grpo $SEEING/sftL_0 rp2_0 & VLRL_REPLAY_STEPS=4 grpo $SEEING/sftL_0 rp4_0 & wait
# git apply -R $R/replay-winners.patch

# 6. The transformers engine's fast path on CPU: 6 steps each way, 2 threads, alone on the machine.
for fd in false true; do
  rm -rf $W/runs/fd_$fd
  $V train $C model.path=$SEEING/sftL_0 model.init_tiny=null tracking.enabled=false runtime.torch_threads=2 \
    storage.root=$W/runs storage.run_name=fd_$fd $ES env.end_when_lost=true train.steps=6 train.eval_every=0 \
    rollout.fast_decode=$fd --quiet
done

# 6b. The fast path with more steps (beside each other, one thread each): 100 and 200 steps, cosine over each.
grpo $SEEING/sftL_0 fd100_0 rollout.fast_decode=true train.steps=100 &
grpo $SEEING/sftL_0 fd200_0 rollout.fast_decode=true train.steps=200 & wait

# 7. Files: eval-*.json (each eval's results.json), paired JSONs, the fast path's step times.
for d in $W/eval-*; do cp $d/results.json $R/$(basename $d).json; done
T() { ls $1/*/traces.jsonl; }
pair() { PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py "$@"; }
for S in 0 1; do
  pair --demonstrator walker_random --seed $S sftR=$(T $W/eval-sftR_$S) armA=$(T $W/eval-AR_$S) \
    grpo=$(T $W/eval-resp_$S) grpo_no_es=$(T $W/eval-rnat_$S) > $R/walker_random-seed$S-paired.json
  pair --demonstrator walker_blind --seed $S sftB=$(T $W/eval-sftB_$S) grpo=$(T $W/eval-Besp_$S) \
    > $R/walker_blind-seed$S-paired.json
done
pair armA=$(T $SEEING/eval-A_0) esp32ds=$(T ${ES_W:-/tmp/es}/eval-esp32ds_0) eps_high10=$(T $W/eval-Lhi_0) replay2=$(T $W/eval-rp2_0) replay4=$(T $W/eval-rp4_0) \
  oracleSFT_1min=$(T $W/eval-osft1_0) oracleSFT_30s=$(T $W/eval-osft0.5_0) fast100=$(T $W/eval-fd100_0) \
  fast200=$(T $W/eval-fd200_0) > $R/walker-seed0-paired.json
python3 - "$W" > $R/fast_decode_steps.json <<'PY'
import json, sys
out = {}
for fd in ("false", "true"):
    rows = [json.loads(line) for line in open(f"{sys.argv[1]}/runs/fd_{fd}/metrics.jsonl")]
    out[f"fast_decode={fd}"] = [{k: r[k] for k in ("step", "time/generate_s", "time/step_s", "reward/mean")} for r in rows]
json.dump(out, sys.stdout, indent=1)
PY
