#!/usr/bin/env bash
# The vision-tower probes (bench/vision_probe.py) on the GPU, one after another, while the GPU
# recipe runs beside them (they are small); all curves end in $OUT/vision_probes.json.
#   OUT=$OUT bash bench/gpu_probes.sh &   ...   wait
set -uo pipefail
OUT=${OUT:-/tmp/probes-out}; P=/tmp/probes; mkdir -p "$OUT" $P
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
PY=${PY:-python3}; DEV=${DEV:-cuda}; STEPS=${PROBE_STEPS:-3000}
for size in maze9 ci; do [ -d $P/$size ] || $PY -m vlrl.cli model init-tiny $P/$size --size $size > /dev/null; done
$PY bench/vision_probe.py --cnn --size 9 --steps 1500 --device $DEV --out $P/cnn-9.json > $P/cnn-9.log 2>&1
$PY bench/vision_probe.py --model-dir $P/maze9 --size 9 --steps $STEPS --lr 1e-3 --device $DEV --out $P/maze9-lr1e-3.json > $P/m1.log 2>&1
$PY bench/vision_probe.py --model-dir $P/maze9 --size 9 --steps $STEPS --lr 3e-4 --device $DEV --out $P/maze9-lr3e-4.json > $P/m2.log 2>&1
$PY bench/vision_probe.py --model-dir $P/ci --size 9 --steps $STEPS --lr 1e-3 --device $DEV --out $P/ci-lr1e-3.json > $P/c1.log 2>&1
$PY - $P "$OUT/vision_probes.json" <<'PY'
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(runs, indent=1))
for name, r in runs.items():
    c = r["curve"]
    print(name, " ".join(f"{e['step']}:{e['holdout_exact']:.2f}" for e in c[:: max(1, len(c) // 12)] + c[-1:]), f"({c[-1]['seconds']} s)")
PY
for f in $P/*.log; do echo "$f: $(tail -n 1 $f)"; done
