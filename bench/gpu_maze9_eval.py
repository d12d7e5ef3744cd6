"""The final evaluation of the GPU recipe (bench/gpu_maze9.sh final): base, SFT and GRPO, greedy,
on the holdout and adversarial splits of configs/gpu-maze9.yaml, with Wilson intervals, the
paired test (McNemar, same mazes), turns against the oracle's optimum, invalid rate, per size,
per adversarial variant; the learning curve with the SFT start and the base as bands.

    python bench/gpu_maze9_eval.py --config configs/gpu-maze9.yaml --work /tmp/maze9 --out OUT -- OVERRIDES...

Writes OUT/eval-holdout/, OUT/eval-adversarial/ (summary.json + traces.jsonl per model, paired.json;
`vlrl eval-verify` re-checks them), OUT/gpu_maze9_eval.json and OUT/learning_curve.png.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from rich.console import Console

from vlrl.config import load_config
from vlrl.eval.evaluate import group_table, paired_table, pair_results, results_table
from vlrl.eval.protocol import evaluate_models
from vlrl.eval.stats import Proportion
from vlrl.report.plots import learning_curve


def by_variant(result) -> dict[str, dict]:
    """Success per adversarial variant (theme, transform, placement), from the traces' task params."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for trace, episode in zip(result.traces, result.episodes):
        params = trace.get("task", {}).get("params", {})
        groups[f"{params.get('variant', 'none')} {params.get('size')}x{params.get('size')}"].append(episode["success"] > 0)
    out = {}
    for key in sorted(groups):
        p = Proportion(sum(groups[key]), len(groups[key]))
        out[key] = {"n": p.n, "success_rate": p.rate, "interval": list(p.interval)}
    return out


def oracle_success(config, split: str, n: int) -> dict:
    """The oracle's play on the same tasks: the ceiling (a maze whose shortest path needs more
    moves than max_turns - 1 cannot be won, since `stop` takes a turn too)."""
    from vlrl.envs.base import build_split, make_env

    tasks = build_split(config.env, split)[:n]
    won = 0
    for task in tasks:
        env = make_env(config.env)
        env.reset(task)
        while not (result := env.step(env.oracle_response())).done:
            pass
        won += env.episode_metrics()["success"] > 0
    p = Proportion(won, len(tasks))
    return {"n": p.n, "success_rate": p.rate, "interval": list(p.interval)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--work", required=True, help="Where bench/gpu_maze9.sh keeps the model, the SFT model and the run.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--splits", nargs="+", default=["holdout", "adversarial"], choices=["holdout", "adversarial"])
    ap.add_argument("--models", nargs="+", default=["base", "sft", "grpo"], choices=["base", "sft", "grpo"],
                    help="Which of the three to evaluate (a short session may leave out the base, 0%% on 2026-12-01).")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    work, out = Path(args.work), Path(args.out)
    console = Console(width=140)
    config = load_config(args.config, args.overrides)
    run = Path(config.storage.root) / (config.storage.run_name or "")
    models = [m for m in [("base", str(work / "model"), None), ("sft", str(work / "sft-model"), None),
                          ("grpo", str(work / "sft-model"), str(run / "adapter"))] if m[0] in args.models]
    report: dict = {"config": args.config, "overrides": args.overrides, "splits": {}}
    for split in args.splits:
        t0 = time.perf_counter()
        n = getattr(config.env, split).count
        results = evaluate_models(config, models, split=split, limit=n, greedy=True, out_dir=out / f"eval-{split}")
        seconds = time.perf_counter() - t0
        console.print(results_table(results, title=f"{split}: {n} mazes, greedy ({seconds:.0f} s)"))
        console.print(group_table(results))
        console.print(paired_table(results))
        by = {r.label: r for r in results}
        oracle = oracle_success(config, split, n)
        console.print(f"oracle on the same {n} mazes: {100 * oracle['success_rate']:.1f}% (the ceiling)")
        entry = {
            "seconds": round(seconds, 1),
            "oracle": oracle,
            "summaries": {r.label: {k: v for k, v in r.summary().items() if k != "outcomes"} for r in results},
            "paired": {f"{a}_vs_{b}": pair_results(by[a], by[b]).to_json()
                       for a, b in (("grpo", "sft"), ("sft", "base"), ("grpo", "base")) if a in by and b in by},
        }
        if split == "adversarial":
            entry["by_variant"] = {r.label: by_variant(r) for r in results}
            for label, rows in entry["by_variant"].items():
                console.print(f"[bold]{label}[/] by variant: " + "; ".join(
                    f"{k} {100 * v['success_rate']:.0f}% (n={v['n']})" for k, v in rows.items()))
        report["splits"][split] = entry
    evals = json.loads((run / "evals.json").read_text()) if (run / "evals.json").exists() else []
    holdout = report["splits"].get("holdout", {}).get("summaries", {})
    if evals and (run / "metrics.jsonl").exists():
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        bands = {name: holdout[label] for name, label in (("base", "base"), ("SFT (start)", "sft")) if label in holdout}
        learning_curve(history, evals, out / "learning_curve.png", baselines=bands,
                       title="GRPO on 9x9 block mazes (maze9, one H200)")
    report["learning_curve"] = [{"step": e["step"], "success_rate": e["success_rate"], "n": e["n"]} for e in evals]
    (out / "gpu_maze9_eval.json").write_text(json.dumps(report, indent=1))
    vs = report["splits"].get("holdout", {}).get("paired", {}).get("grpo_vs_sft")
    if vs:
        console.print(f"holdout GRPO vs SFT: {json.dumps(vs)}")


if __name__ == "__main__":
    main()
