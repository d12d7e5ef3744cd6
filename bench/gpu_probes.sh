#!/usr/bin/env bash
# The vision-tower probes (bench/vision_probe.py) on the GPU, one after another (they are small
# enough to run beside the GPU recipe). $OUT/vision_probes.json (default OUT=/tmp/probes-out) holds
# every probe finished so far, so a timeout loses only the one running. Needs vlrl's dependencies
# importable (pydantic: see .gpuwhl in gpu_maze9.sh).
#   OUT=DIR PROBE_STEPS=1500 timeout 200 bash bench/gpu_probes.sh > DIR/probes.log 2>&1
set -uo pipefail
OUT=${OUT:-/tmp/probes-out}; P=/tmp/probes; mkdir -p "$OUT" $P
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
PY=${PY:-python3}; DEV=${DEV:-cuda}; STEPS=${PROBE_STEPS:-3000}
collect() {
  $PY - $P "$OUT/vision_probes.json" <<'PY'
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(runs, indent=1))
for name, r in runs.items():
    c = r["curve"]
    print(name, " ".join(f"{e['step']}:{e['holdout_exact']:.2f}" for e in c[:: max(1, len(c) // 12)] + c[-1:]), f"({c[-1]['seconds']} s)")
PY
}
probe() {  # name, then vision_probe.py arguments
  local name=$1; shift
  $PY bench/vision_probe.py "$@" --device $DEV --out $P/$name.json > $P/$name.log 2>&1 || tail -n 3 $P/$name.log
  collect
}
for size in maze9 ci; do [ -d $P/$size ] || $PY -m vlrl.cli model init-tiny $P/$size --size $size > /dev/null; done
probe maze9-lr1e-3 --model-dir $P/maze9 --size 9 --steps $STEPS --lr 1e-3
probe cnn-9 --cnn --size 9 --steps 1500
probe maze9-lr3e-4 --model-dir $P/maze9 --size 9 --steps $STEPS --lr 3e-4
probe ci-lr1e-3 --model-dir $P/ci --size 9 --steps $STEPS --lr 1e-3
