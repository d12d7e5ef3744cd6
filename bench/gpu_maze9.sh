#!/usr/bin/env bash
# The reference task on one GPU (issue 18): configs/gpu-maze9.yaml in three stages, each a command of
# at most ~10 minutes; the run checkpoints to $WORK and resumes across them, so run them back to back
# on the same machine:
#
#   OUT=DIR bash bench/gpu_maze9.sh sft                  # model, vision pretraining, SFT (7 min), first GRPO steps
#   OUT=DIR bash bench/gpu_maze9.sh grpo                 # GRPO, --resume auto
#   OUT=DIR FINAL_GRPO_S=60 bash bench/gpu_maze9.sh final   # last GRPO step(s), evaluation, report
#
# The equal-compute A/B on an imperfect demonstrator (issue 32), two commands back to back:
#   OUT=DIR DEMONSTRATOR=walker SFT_MIN=3 ARM_MIN=3 bash bench/gpu_maze9.sh walker         # shared start + arm A
#   OUT=DIR DEMONSTRATOR=walker ARM_MIN=3 ARMS="grpo=..." bash bench/gpu_maze9.sh walker-final  # arm B + evaluation
# or all of it in one command (the arms one after the other, holdout only), which needs no warm machine between calls:
#   OUT=DIR DEMONSTRATOR=walker VISION_MIN=0.5 SFT_MIN=1 ARM_MIN=1.5 EVAL_N=200 bash bench/gpu_maze9.sh walker-ab
# Transfer with reward only (issue 32), one command: SFT on 9x9 (the shared start, DEMONSTRATOR default the
# config's oracle), arm A the same 9x9 SFT for ARM_MIN more minutes, arm B GRPO on TRANSFER_SIZE x TRANSFER_SIZE
# mazes (default 11, TRANSFER_TURNS 26 turns) with no demonstrations of that size, then the start and both arms
# on the first EVAL_N holdout mazes of each of TRANSFER_EVAL (default "11:26 13:32", size:turns), greedy, paired:
#   OUT=DIR VISION_MIN=0.4 SFT_MIN=1 ARM_MIN=1.25 EVAL_N=150 bash bench/gpu_maze9.sh transfer
# `walker`: vision pretraining, SFT on the demonstrator for SFT_MIN (the shared start, WORK/sft-model),
# then arm A: that SFT continued for ARM_MIN more minutes (WORK/sft-long-model; another train.seed,
# so it draws other transcripts than the start's). `walker-final`: arm B, GRPO for ARM_MIN minutes
# from the shared start; then the start, both arms and the demonstrator itself on the same holdout
# and adversarial mazes, paired. SEED sets train.seed of every stage.
#
# OUT (default /tmp/gpu-maze9-out) receives the logs, histories, evaluation summaries and archives;
# WORK (default /tmp/maze9) holds the models and runs between stages. BUDGET_S caps each command.
# ARMS (below) trains several GRPO variants side by side from the same SFT model; give all three
# commands the same ARMS. The final evaluation (3 models x 500 holdout + 500 adversarial mazes) takes
# most of a 10-minute command, so FINAL_GRPO_S leaves it room. OVERHEAD=1 first runs
# bench/per_image_overhead.py on the GPU (~2 min with its start, so off by default).
#
# pydantic is the only vlrl dependency some GPU images lack on this path; wheels put in .gpuwhl/ are
# installed into /tmp/site first, e.g.:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .gpuwhl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection
# SMOKE=1 runs the same stages on a CPU with a tiny model and small budgets (a check of the script).
set -uo pipefail
STAGE=${1:?usage: bench/gpu_maze9.sh sft|grpo|final|walker|walker-final|walker-ab|transfer}
[ "$STAGE" = transfer ] && DEMONSTRATOR=${DEMONSTRATOR:-oracle}  # its shared start: SFT on 9x9 transcripts
OUT=${OUT:-/tmp/gpu-maze9-out}
WORK=${WORK:-/tmp/maze9}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/gpu_maze9-$STAGE.log") 2>&1
T0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - T0)) s] $*"; }
left() { echo $(( ${BUDGET_S:-570} - ($(date +%s) - T0) )); }   # seconds left in this command

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ls .gpuwhl/*.whl >/dev/null 2>&1 && ! python3 -c "import pydantic" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpuwhl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/src
PY=${PY:-python3}
stamp "$STAGE $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader

CFG=configs/gpu-maze9.yaml
SET=(storage.root=$WORK/runs tracking.enabled=false train.seed=${SEED:-0})
# DEMONSTRATOR: whose transcripts SFT imitates (train.sft.demonstrator): oracle (the config's) or walker.
[ -n "${DEMONSTRATOR:-}" ] && SET+=(train.sft.demonstrator=$DEMONSTRATOR)
if [ -n "${SMOKE:-}" ]; then
  SET+=(model.init_tiny=ci runtime.use_gpu=false runtime.torch_threads=2 train.sft.episodes=64 train.sft.batch_size=16
        train.sft.data_workers=1 algo.tasks_per_step=2 algo.group_size=4 algo.mini_batch_size=8 algo.micro_batch_size=8
        train.eval_tasks=4 train.eval_every=2 train.checkpoint_every=2 env.holdout.count=6 env.adversarial.count=6
        train.vision_pretrain.tasks=256 train.vision_pretrain.eval_tasks=6 train.vision_pretrain.eval_every=10)
fi
SFT_SET=("${SET[@]}" model.path=$WORK/model)
# The look drill (LOOK_MIN minutes, 0: none) on the random model, then the walk's SFT for the rest
# of the 7 minutes (SFT_MIN): single-turn maze_look episodes with the agent anywhere. Off by default:
# the drill did not teach the maze9 model to see, and the walk's SFT from the drilled model ended at
# a higher loss than from the random model (bench/results/2026-12-02-h200-maze9-look-drill/).
LOOK_MIN=${LOOK_MIN:-0}
# Perception pretraining first (VISION_MIN minutes, 0: none): the vision tower learns, from dense
# labels on every block, which blocks are walls and which moves are open (vlrl model pretrain-vision).
# The tower reads every label within a few hundred steps, seconds on a GPU, so 0.75 min leaves a wide
# margin and gives SFT the rest (bench/results/2026-12-02-h200-maze9-vision-pretrain/).
VISION_MIN=${VISION_MIN:-0.75}
SFT_MIN=${SFT_MIN:-$(python3 -c "print(7.0 - $LOOK_MIN - $VISION_MIN)")}
# Batches of 64 (LOOK_BATCH): the drill's loss drops suddenly after a plateau, so steps count more
# than examples (batches of 256 stayed on the plateau; same report as LOOK_MIN).
LOOK_SET=("${SET[@]}" model.path=$WORK/model env.name=maze_look env.placement=random env.max_turns=1
          train.sft.batch_size=${LOOK_BATCH:-64} train.sft.noise=0 train.sft.episodes=100000 train.sft.epochs=20
          train.sft.max_minutes=$LOOK_MIN)
# GRPO starts on the SFT model, in bf16 on a GPU (fp32 on the CPU smoke). GRPO_EXTRA: more overrides
# for GRPO and the evaluation, space-separated (e.g. "algo.step_advantage_weight=1 model.lora.include_vision=false").
GRPO_SET=("${SET[@]}" model.path=$WORK/sft-model model.init_tiny=null)
[ -z "${SMOKE:-}" ] && GRPO_SET+=(model.dtype=bfloat16)
# shellcheck disable=SC2206
[ -n "${GRPO_EXTRA:-}" ] && GRPO_SET+=(${GRPO_EXTRA})
# ARMS: GRPO variants trained side by side on the one GPU from the same SFT model, each its own
# process and run (runs/gpu-maze9-NAME), so an A/B costs no more device minutes than one run:
#   ARMS="gigpo=algo.step_advantage_weight=1,model.lora.include_vision=false lm=model.lora.include_vision=false"
# (NAME=overrides, comma-separated). The default is one arm, "grpo", with no overrides beyond GRPO_SET.
# Arms side by side train no faster than one after the other on one H200, and a third arm ran out of
# GPU memory (bench/results/2026-12-02-h200-maze9-gigpo/). Arms buy a same-SFT-start comparison, not speed.
ARMS=${ARMS:-grpo=}
ARM_NAMES=()
for spec in $ARMS; do ARM_NAMES+=("${spec%%=*}"); done
arm_overrides() { local spec; for spec in $ARMS; do [ "${spec%%=*}" = "$1" ] && echo "${spec#*=}" | tr ',' ' '; done; }
run_dir() { echo "$WORK/runs/gpu-maze9-$1"; }
ARM_RUNS=()   # gpu_maze9_eval.py's --arm LABEL=RUN_DIR of every arm
for name in "${ARM_NAMES[@]}"; do ARM_RUNS+=(--arm "$name=$(run_dir "$name")"); done
declare -A ARM_STEPS   # final: each arm's train.steps
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # several arms' caches on one GPU: less fragmentation

grpo() {  # every arm's GRPO for at most $1 minutes (each checkpoints and exits 75 when the budget runs out), extra overrides after
  local minutes=$1; shift
  stamp "GRPO for at most $minutes min: ${ARM_NAMES[*]}"
  local pids=() name watch=""
  if command -v nvidia-smi >/dev/null; then  # what the arms together leave of the GPU, every 20 s
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 20 >> "$WORK/gpu_use-$STAGE.csv" &
    watch=$!
  fi
  for name in "${ARM_NAMES[@]}"; do
    # shellcheck disable=SC2046
    ( $PY -m vlrl.cli train $CFG "${GRPO_SET[@]}" storage.run_name=gpu-maze9-$name $(arm_overrides "$name") \
        ${ARM_STEPS[$name]:+train.steps=${ARM_STEPS[$name]}} train.max_minutes=$minutes "$@" --resume auto --quiet 2>&1
      echo "train exit $? (75: paused at a checkpoint, continues with --resume auto)" ) | sed -u "s/^/[$name] /" &
    pids+=($!)
  done
  wait "${pids[@]}"
  [ -n "$watch" ] && kill "$watch" 2>/dev/null
  # The device returns at most 8 files: each arm's metrics, evals and events go in one archive.
  local files=()
  for name in "${ARM_NAMES[@]}"; do
    for f in metrics.jsonl evals.json run-events.jsonl; do
      [ -f "$(run_dir "$name")/$f" ] && cp "$(run_dir "$name")/$f" "$WORK/$name-$f" && files+=("$name-$f")
    done
  done
  [ -f "$WORK/gpu_use-$STAGE.csv" ] && files+=("gpu_use-$STAGE.csv")
  [ ${#files[@]} -gt 0 ] && tar czf "$OUT/grpo-$STAGE.tgz" -C "$WORK" "${files[@]}"
  return 0
}

need_walker_settings() {  # $1: the stage
  [ -n "${DEMONSTRATOR:-}" ] || { echo "$1: set DEMONSTRATOR (e.g. walker)"; exit 2; }
  [ -n "${ARM_MIN:-}" ] || { echo "$1: set ARM_MIN, the minutes each arm gets after the shared start"; exit 2; }
}

walker_start_and_arm_a() {  # $1: the stage. Vision pretraining, the shared start, arm A (SFT for ARM_MIN more minutes)
  need_walker_settings "$1"
  stamp "vision pretraining ($VISION_MIN min)"
  $PY -m vlrl.cli model pretrain-vision $CFG "${SFT_SET[@]}" train.vision_pretrain.max_minutes=$VISION_MIN -o $WORK/seeing-model --overwrite
  echo "pretrain-vision exit $?"
  stamp "SFT on the $DEMONSTRATOR's transcripts ($SFT_MIN min): the shared start"
  $PY -m vlrl.cli sft $CFG "${SFT_SET[@]}" model.path=$WORK/seeing-model model.init_tiny=null \
    train.sft.max_minutes=$SFT_MIN -o $WORK/sft-model --overwrite
  echo "sft exit $?"
  cp $WORK/sft-model/sft_history.json "$OUT/" 2>/dev/null
  stamp "arm A: the same SFT for $ARM_MIN more minutes from the shared start (another train.seed)"
  $PY -m vlrl.cli sft $CFG "${SFT_SET[@]}" model.path=$WORK/sft-model model.init_tiny=null \
    train.seed=$(( ${SEED:-0} + 1000 )) train.sft.max_minutes=$ARM_MIN -o $WORK/sft-long-model --overwrite
  echo "sft-long exit $?"
  cp $WORK/sft-long-model/sft_history.json "$OUT/sft_long_history.json" 2>/dev/null
}

walker_eval() {  # $1: the stage (names the archive), $2: the splits. The start, both arms and the demonstrator, greedy
  local final=$WORK/final name
  stamp "evaluation: the start, arm A (sft-long), arm B (${ARM_NAMES[*]}) and the $DEMONSTRATOR (greedy)"
  # shellcheck disable=SC2086
  $PY bench/gpu_maze9_eval.py --config $CFG --work $WORK --out "$final" --splits $2 \
    --models sft --full-model sft-long=$WORK/sft-long-model --demonstrator "${ARM_RUNS[@]}" -- "${GRPO_SET[@]}" \
    ${EVAL_N:+env.holdout.count=$EVAL_N}  # EVAL_N: the first N holdout mazes (default: the config's count)
  echo "eval exit $?"
  for name in "${ARM_NAMES[@]}"; do
    for f in metrics.jsonl evals.json run-events.jsonl; do cp "$(run_dir "$name")/$f" "$final/$name-$f" 2>/dev/null; done
  done
  cp "$final/gpu_maze9_eval.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/maze9-$1.tgz" -C "$final" . && ls -la "$OUT"
}

case "$STAGE" in
sft)
  if [ -n "${OVERHEAD:-}" ] && [ -z "${SMOKE:-}" ]; then  # what the per-image loops cost on this GPU, and that the batched paths agree
    stamp "per-image overhead: transformers' paths against the batched ones, 64 episodes"
    timeout 150 $PY bench/per_image_overhead.py --episodes 64 --device cuda --model-dir $WORK/model \
      --out "$OUT/per_image_overhead.json" | tail -8
  fi
  SFT_FROM=("${SFT_SET[@]}" train.sft.max_minutes=$SFT_MIN)
  # The stage's models are its own: a second run on the same machine (SMOKE=1, a repeated call on a
  # warm GPU machine) replaces them, hence --overwrite (without it they refuse an existing directory).
  if [ "$VISION_MIN" != 0 ]; then
    stamp "vision pretraining: the tower learns to see every block ($VISION_MIN min)"
    $PY -m vlrl.cli model pretrain-vision $CFG "${SFT_SET[@]}" train.vision_pretrain.max_minutes=$VISION_MIN -o $WORK/seeing-model --overwrite
    echo "pretrain-vision exit $?"
    cp $WORK/seeing-model/vision_pretrain_history.json "$OUT/" 2>/dev/null
    $PY -c "import json,sys; [print(' ', json.dumps(r)) for r in json.load(open(sys.argv[1]))]" $WORK/seeing-model/vision_pretrain_history.json
    SFT_FROM+=(model.path=$WORK/seeing-model model.init_tiny=null)
    LOOK_SET+=(model.path=$WORK/seeing-model model.init_tiny=null)
  fi
  if [ "$LOOK_MIN" != 0 ]; then
    # The look drill first (maze_look, see docs/maze.md): an SFT model trained on the walk alone
    # need not read the walls (its first move can depend on the start corner only).
    stamp "look: the random maze9 model learns to name the open moves around the agent ($LOOK_MIN min)"
    $PY -m vlrl.cli sft $CFG "${LOOK_SET[@]}" -o $WORK/look-model --overwrite
    echo "look sft exit $?"
    cp $WORK/look-model/sft_history.json "$OUT/look_sft_history.json" 2>/dev/null
    $PY -m vlrl.cli eval -c $CFG "${LOOK_SET[@]}" model.path=$WORK/look-model model.init_tiny=null -n 500 -o $WORK/eval-look | tail -4
    cp $WORK/eval-look/base/summary.json "$OUT/look_eval_summary.json" 2>/dev/null
    SFT_FROM+=(model.path=$WORK/look-model model.init_tiny=null)
  fi
  stamp "SFT: the model behaviour-clones the oracle's walk (train.sft.max_minutes)"
  $PY -m vlrl.cli sft $CFG "${SFT_FROM[@]}" -o $WORK/sft-model --overwrite
  echo "sft exit $?"
  cp $WORK/sft-model/sft_history.json "$OUT/" 2>/dev/null
  $PY - "$WORK/sft-model/sft_history.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))
for r in h[:: max(1, len(h) // 15)] + h[-1:]:
    print(f"  SFT step {r['step']:5d}  {r['seconds']:7.1f} s  loss {r['loss']:.4f}")
PY
  if [ "${SFT_CHECK_N:-0}" != 0 ]; then  # does the SFT model read the walls? (bench/maze_turn_errors.py)
    stamp "SFT model on $SFT_CHECK_N holdout mazes, greedy, and what its turns did"
    $PY -m vlrl.cli eval -c $CFG "${GRPO_SET[@]}" -n $SFT_CHECK_N -o $WORK/eval-sft-check | tail -3
    $PY bench/maze_turn_errors.py $WORK/eval-sft-check/base/traces.jsonl --json "$OUT/sft_check_turn_errors.json"
  fi
  mins=$(( ($(left) - 45) / 60 ))
  [ "$mins" -ge 1 ] && grpo "$mins"
  ;;
grpo)
  grpo "$(( ($(left) - 40) / 60 ))"
  ;;
final)
  # Finish each arm's run: its train.steps is set to where the time left for training
  # (FINAL_GRPO_S, at that arm's median step time) ends; then the evaluation of all.
  for name in "${ARM_NAMES[@]}"; do
    steps=$($PY - "$(run_dir "$name")" "${FINAL_GRPO_S:-60}" <<'PY'
import json, sys, pathlib
run, budget = pathlib.Path(sys.argv[1]), float(sys.argv[2])
rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
done = max(r["step"] for r in rows)
secs = sorted(r.get("time/step_s", 0) for r in rows[-10:])
per_step = secs[len(secs) // 2] or 10.0
print(done + max(1, int(budget // per_step)))
PY
)
    ARM_STEPS[$name]=$steps
    stamp "$name: GRPO to step $steps"
  done
  grpo 9
  # Everything of the evaluation goes to $FINAL; $OUT gets the summary files and one archive
  # (the device returns at most 8 files, two folders down).
  FINAL=$WORK/final
  stamp "evaluation: ${FINAL_MODELS:-base sft} and the arms (${ARM_NAMES[*]}) on ${FINAL_SPLITS:-holdout adversarial} (greedy)"
  $PY bench/gpu_maze9_eval.py --config $CFG --work $WORK --out "$FINAL" --splits ${FINAL_SPLITS:-holdout adversarial} \
    --models ${FINAL_MODELS:-base sft} "${ARM_RUNS[@]}" ${FINAL_ADV_ARMS:+--adversarial-arms $FINAL_ADV_ARMS} -- "${GRPO_SET[@]}"
  echo "eval exit $?"
  stamp "re-verifying the saved traces"
  for d in "$FINAL"/eval-*; do echo "$d"; $PY -m vlrl.cli eval-verify "$d" | tail -8; done
  for name in "${ARM_NAMES[@]}"; do
    run=$(run_dir "$name")
    $PY -m vlrl.cli report "$run" --out "$FINAL/report-$name.html" && echo "report of $name written"
    for f in metrics.jsonl evals.json run-events.jsonl; do cp "$run/$f" "$FINAL/$name-$f" 2>/dev/null; done
  done
  cp $WORK/sft-model/sft_history.json "$FINAL/" 2>/dev/null
  cp "$FINAL/gpu_maze9_eval.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/maze9-final.tgz" -C "$FINAL" . && ls -la "$OUT"
  ;;
walker)
  walker_start_and_arm_a walker
  ;;
walker-final)
  ARM_MIN=${ARM_MIN:?walker-final: set ARM_MIN, as for the walker stage}
  grpo "$ARM_MIN"
  for name in "${ARM_NAMES[@]}"; do  # finish each run at the step its time box ended (adapter + final check)
    ARM_STEPS[$name]=$($PY -c "import json,sys; print(max(json.loads(l)['step'] for l in open(sys.argv[1])))" \
      "$(run_dir "$name")/metrics.jsonl")
  done
  grpo 3
  walker_eval walker-final "${FINAL_SPLITS:-holdout adversarial}"
  ;;
walker-ab)
  # The whole equal-compute A/B in ONE command (a second command needs the machine still warm, which
  # three tries lost): the walker stage, arm B (GRPO) for ARM_MIN minutes, then both arms, the start
  # and the demonstrator on the same holdout mazes. The arms run one after the other, each with the
  # whole GPU: side by side, the full-weight SFT arm (79 GiB) and the GRPO arm (61 GiB) ran out of the
  # H200's memory on GRPO's first update (bench/results/2026-12-04-h200-maze9-walker-ab/).
  need_walker_settings walker-ab  # before anything is removed
  rm -rf "$WORK/runs"  # a repeated call on a warm machine starts over (grpo() resumes what it finds)
  walker_start_and_arm_a walker-ab
  # finish: the time box ends each GRPO arm with its adapter (no second, resuming command).
  grpo "$ARM_MIN" train.on_time_limit=finish train.eval_every=0 train.checkpoint_every=0 train.eval_tasks=${ARM_EVAL_TASKS:-16}
  walker_eval walker-ab "${FINAL_SPLITS:-holdout}"
  ;;
transfer)
  need_walker_settings transfer
  # The sizes are checked before anything runs: a size the blocks layout cannot draw (even, < 5) ends here
  # with the config's one error line.
  T_SIZE=${TRANSFER_SIZE:-11}; T_TURNS=${TRANSFER_TURNS:-26}; T_EVAL=${TRANSFER_EVAL:-11:26 13:32}
  ctx() { echo $(( $2 * ($1 * $1 + 64) + 512 )); }  # tokens of a whole episode: one image token per block each turn
  for st in "$T_SIZE:$T_TURNS" $T_EVAL; do
    $PY -m vlrl.cli config validate $CFG "${SET[@]}" "env.sizes=[${st%%:*}]" env.max_turns=${st#*:} >/dev/null || exit 2
  done
  rm -rf "$WORK/runs"
  walker_start_and_arm_a transfer
  grpo "$ARM_MIN" "env.sizes=[$T_SIZE]" env.max_turns=$T_TURNS rollout.max_model_len=$(ctx "$T_SIZE" "$T_TURNS") \
    train.on_time_limit=finish train.eval_every=0 train.checkpoint_every=0 train.eval_tasks=${ARM_EVAL_TASKS:-16}
  for st in $T_EVAL; do
    size=${st%%:*}; turns=${st#*:}
    stamp "evaluation on ${size}x$size ($turns turns): the 9x9 start, arm A (9x9 SFT) and arm B (GRPO on ${T_SIZE}x$T_SIZE)"
    # shellcheck disable=SC2086
    $PY bench/gpu_maze9_eval.py --config $CFG --work $WORK --out $WORK/final-$size --splits holdout \
      --models sft --full-model sft-long=$WORK/sft-long-model "${ARM_RUNS[@]}" -- "${GRPO_SET[@]}" \
      "env.sizes=[$size]" env.max_turns=$turns rollout.max_model_len=$(ctx "$size" "$turns") ${EVAL_N:+env.holdout.count=$EVAL_N}
    echo "eval exit $?"
    cp $WORK/final-$size/gpu_maze9_eval.json "$OUT/transfer_eval_$size.json" 2>/dev/null
  done
  # shellcheck disable=SC2046
  tar czf "$OUT/maze9-transfer.tgz" -C "$WORK" $(for st in $T_EVAL; do echo "final-${st%%:*}"; done) && ls -la "$OUT"
  ;;
*) echo "unknown stage $STAGE"; exit 2 ;;
esac
stamp "end of $STAGE"
