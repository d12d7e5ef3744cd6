#!/bin/bash
# usage: grpo.sh NAME [overrides...]  -> GRPO from /tmp/e/sft0, then greedy eval on 400 holdout
name=$1; shift
cd /work/main
/usr/bin/time -v .venv/bin/vlrl train configs/demo-cpu.yaml model.path=${START:-/tmp/e/sft0} model.init_tiny=null tracking.enabled=false storage.root=/tmp/e/runs storage.run_name=$name runtime.torch_threads=${THREADS:-1} "$@" --quiet > /tmp/e/$name.log 2>&1
.venv/bin/vlrl eval -c configs/demo-cpu.yaml --model ${START:-/tmp/e/sft0} --adapter /tmp/e/runs/$name/adapter model.init_tiny=null tracking.enabled=false runtime.torch_threads=${THREADS:-1} --no-base -n 400 -o /tmp/e/eval-$name >> /tmp/e/$name.log 2>&1
echo DONE >> /tmp/e/$name.log
