#!/bin/bash
# Equal-compute SFT twin of the GRPO recipe L_t15_g16 (T 1.5, GiGPO, group 16 x 4 tasks), seeds 0 and 1.
# Run from the repository root: bash bench/results/2026-12-06-cpu-demo-equal-compute-t15g16/run.sh
# The two seeds run side by side, 1 torch thread each, stage by stage (both of a stage finish before the next).
# Everything is written under /tmp/e2 (the base tiny model too, instead of runs/models in the checkout).
set -u
cd "$(git rev-parse --show-toplevel)"
W=${W:-/tmp/e2}
SEEDS=${SEEDS:-0 1}  # e.g. SEEDS="2 3" W=/tmp/e3 for two more seeds
mkdir -p $W/logs
V=.venv/bin/vlrl
C=configs/demo-cpu.yaml
COMMON="tracking.enabled=false runtime.torch_threads=1 storage.root=$W/runs"

# The demo's base model (model.init_tiny=ci, seed 0: what `vlrl sft` would build at runs/models/tiny-demo-ci), built once.
[ -d $W/tiny-demo-ci ] || $V model init-tiny $W/tiny-demo-ci --size ci --seed 0 > $W/logs/init-tiny.log 2>&1

stage() { echo "$(date -u +%FT%TZ) $*" | tee -a $W/logs/stages.txt; }

# 1. sft0_S: the demo's own walker-SFT warm start (loss target 0.27)
stage sft0
for S in $SEEDS; do
  $V sft $C model.path=$W/tiny-demo-ci train.seed=$S $COMMON -o $W/sft0_$S > $W/logs/sft0_$S.log 2>&1 &
done; wait

# 2. sftL_S: continued for up to 5 epochs (320 steps) on other transcripts (train.seed 1000+S)
stage sftL
for S in $SEEDS; do
  $V sft $C model.path=$W/sft0_$S model.init_tiny=null train.sft.target_loss=null train.sft.epochs=5 \
    train.seed=$((1000+S)) $COMMON -o $W/sftL_$S > $W/logs/sftL_$S.log 2>&1 &
done; wait

# 3. arm B: GRPO L_t15_g16 from sftL_S, 80 steps (the demo's), whole wall time W_B
stage armB
for S in $SEEDS; do
  ( t0=$(date +%s.%N)
    /usr/bin/time -v $V train $C model.path=$W/sftL_$S model.init_tiny=null $COMMON storage.run_name=B_$S \
      rollout.temperature=1.5 algo.step_advantage_weight=1.0 algo.group_size=16 algo.tasks_per_step=4 \
      train.seed=$S --quiet > $W/logs/B_$S.log 2> $W/logs/B_$S.time
    echo "rc=$?" >> $W/logs/B_$S.time
    python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" $t0 $(date +%s.%N) > $W/logs/B_$S.wall
  ) &
done; wait

# 4. arm A: SFT from sftL_S for W_B minutes of its training loop (train.sft.max_minutes), other transcripts
stage armA
for S in $SEEDS; do
  MIN=$(python3 -c "print(round(float(open('$W/logs/B_$S.wall').read()) / 60, 3))")
  echo "seed $S: W_B $(cat $W/logs/B_$S.wall) s -> train.sft.max_minutes=$MIN" | tee -a $W/logs/stages.txt
  ( t0=$(date +%s.%N)
    /usr/bin/time -v $V sft $C model.path=$W/sftL_$S model.init_tiny=null train.sft.max_minutes=$MIN \
      train.sft.target_loss=null train.sft.epochs=50 train.seed=$((2000+S)) $COMMON -o $W/A_$S \
      > $W/logs/A_$S.log 2> $W/logs/A_$S.time
    echo "rc=$?" >> $W/logs/A_$S.time
    python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" $t0 $(date +%s.%N) > $W/logs/A_$S.wall
  ) &
done; wait

# 5. greedy evaluation on the 400 holdout mazes (full-weight SFT models as the base; the GRPO adapter on sftL_S)
stage eval
for S in $SEEDS; do
  ( $V eval -c $C --model $W/sftL_$S model.init_tiny=null $COMMON -n 400 -o $W/eval-sftL_$S > $W/logs/eval-sftL_$S.log 2>&1
    $V eval -c $C --model $W/A_$S model.init_tiny=null $COMMON -n 400 -o $W/eval-A_$S > $W/logs/eval-A_$S.log 2>&1
    $V eval -c $C --model $W/sftL_$S --adapter $W/runs/B_$S/adapter model.init_tiny=null $COMMON --no-base -n 400 \
      -o $W/eval-B_$S > $W/logs/eval-B_$S.log 2>&1
  ) &
done; wait

# 6. paired (McNemar exact), every two and each with the walker
stage pair
for S in $SEEDS; do
  PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py \
    sftL=$(ls $W/eval-sftL_$S/*/traces.jsonl) A=$(ls $W/eval-A_$S/*/traces.jsonl) B=$(ls $W/eval-B_$S/*/traces.jsonl) \
    > $W/paired_$S.json 2> $W/logs/pair_$S.log
done
stage done
