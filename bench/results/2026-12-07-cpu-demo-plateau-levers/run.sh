#!/usr/bin/env bash
# Issue 32, CPU demo: more GRPO levers on top of the 16-tasks x group-4 recipe (T 1.5, GiGPO w1), from the
# walker-level starts sftL_S of 2026-12-06-cpu-demo-seeing-start/long (START=/tmp/seeingL of that report's run.sh).
# Two runs at a time, one thread each; each arm is evaluated greedy on the first 400 holdout mazes (6 turns).
# ds and ds10 ran seed 0 only. From the checkout's root.
set -u
cd "$(git rev-parse --show-toplevel)"
START=${START:-/tmp/seeingL}; W=${W:-/tmp/sc}
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
both sc05 env.rewards.step_cost=-0.05                                   # a cost per turn: short paths win more
both ewl env.end_when_lost=true                                         # end an episode once the goal is out of reach
run 0 ds env.end_when_lost=true algo.dynamic_sampling=true &            # drop all-equal groups, refill (3 rounds)
run 0 ds10 env.end_when_lost=true algo.dynamic_sampling=true rollout.temperature=1.0 & wait
both t32g2 env.end_when_lost=true algo.group_size=2 algo.tasks_per_step=32   # 32 tasks x group 2
both mt10 env.max_turns=10 env.rewards.step_cost=-0.05                  # train with 10 turns, evaluate with 6
both mt10e env.max_turns=10 env.rewards.step_cost=-0.05 env.end_when_lost=true train.steps=50   # the same in t16g4's time
both far env.end_when_lost=true env.min_distance=4                      # train on long mazes only (evaluated on all)
# Pairing (McNemar, with the walker), and where the failures part from the oracle-SFT model. DENSE: the
# capacity/task-diversity report's W (its t16g4 evaluations); CAP: its oracle-SFT LoRA evaluation (this run read
# it from CAP=/tmp/cap/eval-lora).
DENSE=${DENSE:-/tmp/dense}; CAP=${CAP:-$DENSE/eval-oracle-lora_0}; R=bench/results/2026-12-07-cpu-demo-plateau-levers
T() { ls $1/*/traces.jsonl; }
pair() { PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py "$@"; }
pair armA=$(T $START/eval-A_0) t16g4=$(T $DENSE/eval-t16g4_0) sc05=$(T $W/eval-sc05_0) ewl=$(T $W/eval-ewl_0) \
  ds=$(T $W/eval-ds_0) ds10=$(T $W/eval-ds10_0) t32g2=$(T $W/eval-t32g2_0) mt10=$(T $W/eval-mt10_0) \
  mt10e=$(T $W/eval-mt10e_0) far=$(T $W/eval-far_0) oracleLoRA=$(T $CAP) > $R/seed0-paired.json
pair armA=$(T $START/eval-A_1) t16g4=$(T $DENSE/eval-t16g4_1) sc05=$(T $W/eval-sc05_1) ewl=$(T $W/eval-ewl_1) \
  t32g2=$(T $W/eval-t32g2_1) mt10=$(T $W/eval-mt10_1) mt10e=$(T $W/eval-mt10e_1) far=$(T $W/eval-far_1) > $R/seed1-paired.json
for A in t16g4:$DENSE mt10:$W far:$W; do
  python3 $R/first_move.py $(T ${A#*:}/eval-${A%%:*}_0) $(T $CAP) $(T $START/eval-A_0) > $R/first_move-${A%%:*}_0.json
done
# eval-*.json: each eval's results.json; curve-*.json: metrics.jsonl's sampled success, entropy, step time, the
# greedy checks of evals.json (64 tasks, in the run's own env: 10 turns for mt10) and the sum of step times.
