#!/usr/bin/env bash
# Issue 32, CPU demo: GRPO with exploring starts (algo.exploring_starts) from the walker-level starts sftL_S of
# 2026-12-06-cpu-demo-seeing-start/long (START=/tmp/seeingL of that report's run.sh). Two runs at a time, one thread
# each; each arm is evaluated greedy on the first 400 holdout mazes (6 turns). From the checkout's root.
# es and es10 ran at 666643f, where every episode of a group was forced (all G first moves dealt out of the legal
# ones); every later arm at 4f0ec43 (the legal moves replace the first samples only, the rest sample).
# esf needs update-first-turn.patch (algo.update_turns=first; measured worse and not kept in main).
set -u
cd "$(git rev-parse --show-toplevel)"
START=${START:-/tmp/seeingL}; W=${W:-/tmp/es}
mkdir -p $W/logs
V=.venv/bin/vlrl; C=configs/demo-cpu.yaml
COMMON="tracking.enabled=false runtime.torch_threads=1 storage.root=$W/runs"
T16G4="rollout.temperature=1.5 algo.step_advantage_weight=1.0 algo.group_size=4 algo.tasks_per_step=16"
run() { S=$1; N=$2; shift 2
  $V train $C model.path=$START/sftL_$S model.init_tiny=null $COMMON storage.run_name=${N}_$S train.seed=$S $T16G4 "$@" \
    --quiet > $W/logs/${N}_$S.log 2>&1
  $V eval -c $C model.path=$START/sftL_$S model.init_tiny=null $COMMON -n 400 --no-base -a $W/runs/${N}_$S/adapter \
    -o $W/eval-${N}_$S > $W/logs/eval-${N}_$S.log 2>&1; }
both() { run 0 "$@" & run 1 "$@" & wait; }
ES="env.end_when_lost=true algo.exploring_starts=true"
both es $ES                                                            # t16g4 (T 1.5) + exploring starts (666643f)
both es10 $ES rollout.temperature=1.0                                  # the same at T 1.0 (666643f)
ES10="$ES rollout.temperature=1.0"
G2="algo.group_size=2 algo.tasks_per_step=32 algo.dynamic_sampling=true"
run 0 esp $ES10 &                                                      # from here on: 4f0ec43
run 0 esp32ds $ES10 $G2 & wait                                         # 32 tasks x group 2, dynamic sampling
run 0 esm16 $ES10 $G2 algo.mini_batch_size=16 &                        # twice the optimizer steps
run 0 esconst $ES10 $G2 train.lr_schedule=constant & wait              # no cosine decay
run 1 esp32ds $ES10 $G2 &
run 0 esp64e1 $ES10 algo.group_size=2 algo.tasks_per_step=64 algo.dynamic_sampling=true algo.ppo_epochs=1 & wait
run 0 eskl $ES10 $G2 algo.kl_coef=0.05 &                               # anchored to the start
run 0 esnov $ES10 $G2 model.lora.include_vision=false & wait           # no LoRA on the vision tower
# run 0 esf $ES10 algo.update_turns=first                              # with update-first-turn.patch applied
# Does the mechanism learn at all? 16 training tasks only, 20 steps, 2 threads (666643f):
$V train $C model.path=$START/sftL_0 model.init_tiny=null tracking.enabled=false runtime.torch_threads=2 \
  storage.root=$W/runs storage.run_name=tiny16 train.seed=0 rollout.temperature=1.0 algo.step_advantage_weight=1.0 \
  algo.group_size=4 algo.tasks_per_step=16 $ES env.train.count=16 train.steps=20 train.eval_every=0 --quiet
# Pairing (McNemar, with the walker). DENSE: the capacity/task-diversity report's W (its t16g4 evaluations).
DENSE=${DENSE:-/tmp/dense}; CAP=${CAP:-/tmp/cap/lora_oracle_0}; R=bench/results/2026-12-07-cpu-demo-exploring-starts
T() { ls $1/*/traces.jsonl; }
pair() { PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py "$@"; }
pair armA=$(T $START/eval-A_0) t16g4=$(T $DENSE/eval-t16g4_0) es=$(T $W/eval-es_0) es10=$(T $W/eval-es10_0) \
  esp=$(T $W/eval-esp_0) esp32ds=$(T $W/eval-esp32ds_0) esm16=$(T $W/eval-esm16_0) esconst=$(T $W/eval-esconst_0) \
  esp64e1=$(T $W/eval-esp64e1_0) esf=$(T $W/eval-esf_0) eskl=$(T $W/eval-eskl_0) esnov=$(T $W/eval-esnov_0) \
  > $R/seed0-paired.json
pair armA=$(T $START/eval-A_1) t16g4=$(T $DENSE/eval-t16g4_1) es=$(T $W/eval-es_1) es10=$(T $W/eval-es10_1) \
  esp32ds=$(T $W/eval-esp32ds_1) > $R/seed1-paired.json
# The first move: how sure each policy is (400 holdout mazes; 16 training tasks for tiny16), and what forcing it is worth.
P="env PYTHONPATH=src .venv/bin/python"; mkdir -p $W/probe
for a in start:none es10_0:$W/runs/es10_0/adapter esp32ds_0:$W/runs/esp32ds_0/adapter oracleSFT:$CAP; do
  $P $R/first_move_probs.py $START/sftL_0 ${a#*:} 400 > $W/probe/probs-${a%%:*}.json; done
$P $R/summary.py start=$W/probe/probs-start.json es10_0=$W/probe/probs-es10_0.json \
  esp32ds_0=$W/probe/probs-esp32ds_0.json oracleSFT=$W/probe/probs-oracleSFT.json > $R/first_move_probs-seed0.json
for a in start:none tiny16:$W/runs/tiny16/adapter; do
  $P $R/first_move_probs.py $START/sftL_0 ${a#*:} 16 train env.train.count=16 > $W/probe/train16-${a%%:*}.json; done
$P $R/summary.py start=$W/probe/train16-start.json tiny16=$W/probe/train16-tiny16.json > $R/first_move_probs-train16.json
for T in 0.001 1.0 1.5; do
  $P $R/forced_first_move.py $START/sftL_0 none 400 $T > $W/probe/forced-start-T$T.json
  $P $R/summary.py --forced $W/probe/forced-start-T$T.json $W/probe/probs-start.json > $R/forced_first_move-start-T$T.json
done
# eval-*.json: each eval's results.json; curve-*.json: metrics.jsonl's sampled success, entropy, step time, invalid
# actions, the 64-task greedy checks (evals.json) and the sum of step times.
