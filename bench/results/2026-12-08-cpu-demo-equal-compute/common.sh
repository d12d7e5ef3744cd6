# Sourced by this report's scripts: the paths they share. W holds models, runs and evaluations (default /tmp/ec);
# DEMO_DIR_S=path names a demo already run for seed S (e.g. by `make demo`), else W/demoS.
set -u
cd "$(git rev-parse --show-toplevel)"
R=bench/results/2026-12-08-cpu-demo-equal-compute
W=${W:-/tmp/ec}
V=.venv/bin/vlrl
C=configs/demo-cpu.yaml
mkdir -p "$W"
demo_dir() { local var=DEMO_DIR_$1; echo "${!var:-$W/demo$1}"; }
pair() { PYTHONPATH=src .venv/bin/python bench/results/2026-12-04-cpu-demo-grpo-levers/pair.py --demonstrator walker_random "$@"; }
