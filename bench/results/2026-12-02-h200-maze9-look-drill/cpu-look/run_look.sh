#!/bin/bash
# Copied from /tmp/exp where it ran (2026-12-02, 2-core CPU, vlrl 9dedeb0-19c6f39). Usage: run_look.sh NAME LOOK_MIN MAZE_MIN;
# everything after "exit 0" (the walk SFT from the look model) was not run on CPU.
# usage: run_look.sh NAME LOOK_MIN MAZE_MIN
cd /work/main
N=$1; LM=$2; MM=$3
O=/tmp/exp/$N; mkdir -p $O
COMMON=(env.layout=blocks 'env.sizes=[7]' tracking.enabled=false storage.root=/tmp/exp/runs runtime.torch_threads=2 train.sft.data_workers=1 train.sft.target_loss=null)
LOOK=("${COMMON[@]}" env.name=maze_look env.placement=random env.max_turns=1 model.path=/tmp/exp/model-$N
      train.sft.episodes=65536 train.sft.epochs=1 train.sft.batch_size=64 train.sft.max_minutes=$LM $XLOOK)
MAZE=("${COMMON[@]}" env.placement=corners env.stop_required=true env.max_turns=14 model.path=$O/look model.init_tiny=null
      train.sft.episodes=8192 train.sft.epochs=4 train.sft.max_minutes=$MM)
.venv/bin/python -m vlrl.cli sft configs/demo-cpu.yaml "${LOOK[@]}" -o $O/look > $O.look.log 2>&1
python3 - $O/look/sft_history.json <<'PY'
import json,sys; h=json.load(open(sys.argv[1]))
print('look', ' '.join(f"{r['step']}:{r['loss']:.3f}" for r in h[::max(1,len(h)//12)]+h[-1:]))
PY
.venv/bin/python -m vlrl.cli eval -c configs/demo-cpu.yaml "${LOOK[@]}" model.path=$O/look model.init_tiny=null -n 200 -o $O/eval-look > $O.evallook.log 2>&1
grep -E "│ base" $O.evallook.log | head -1
exit 0
.venv/bin/python -m vlrl.cli sft configs/demo-cpu.yaml "${MAZE[@]}" -o $O/sft > $O.sft.log 2>&1
python3 - $O/sft/sft_history.json <<'PY'
import json,sys; h=json.load(open(sys.argv[1]))
print('maze', ' '.join(f"{r['step']}:{r['loss']:.3f}" for r in h[::max(1,len(h)//12)]+h[-1:]))
PY
.venv/bin/python -m vlrl.cli eval -c configs/demo-cpu.yaml "${MAZE[@]}" model.path=$O/sft -n 200 -o $O/eval > $O.eval.log 2>&1
grep -E "│ base" $O.eval.log | head -1
python3 /tmp/err_analysis.py $O/eval/base/traces.jsonl 2>/dev/null | head -3
