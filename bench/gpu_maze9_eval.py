"""The final evaluation of the GPU recipe (bench/gpu_maze9.sh final): base, SFT and each GRPO arm,
greedy, on the holdout and adversarial splits of configs/gpu-maze9.yaml, with Wilson intervals, the
paired test (McNemar, same mazes: every arm against SFT and the base, and the arms against each
other), turns against the oracle's optimum, invalid rate, per size, per adversarial variant; each
arm's learning curve with the SFT start and the base as bands.

    python bench/gpu_maze9_eval.py --config configs/gpu-maze9.yaml --work /tmp/maze9 --out OUT \
        --arm gigpo=/tmp/maze9/runs/gpu-maze9-gigpo [--arm ...] -- OVERRIDES...

Without --arm, "grpo" is the run the config and overrides name (storage.root / storage.run_name).

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
from vlrl.eval.evaluate import group_table, pair_results, paired_table, results_table
from vlrl.eval.protocol import evaluate_models
from vlrl.eval.stats import Proportion
from vlrl.report.plots import learning_curve


def by_variant(result) -> dict[str, dict]:
    """Success per adversarial variant (theme, transform, placement), from the traces' task params."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for trace, episode in zip(result.traces, result.episodes):
        params = trace.get("task", {}).get("params", {})
        groups[f"{params.get('variant', 'none')} {params.get('size')}x{params.get('size')}"].append(
            episode["success"] > 0
        )
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
        while not env.step(env.oracle_response()).done:
            pass
        won += env.episode_metrics()["success"] > 0
    p = Proportion(won, len(tasks))
    return {"n": p.n, "success_rate": p.rate, "interval": list(p.interval)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument(
        "--work", required=True, help="Where bench/gpu_maze9.sh keeps the model, the SFT model and the run."
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--splits", nargs="+", default=["holdout", "adversarial"], choices=["holdout", "adversarial"])
    ap.add_argument(
        "--models",
        nargs="*",
        default=["base", "sft"],
        choices=["base", "sft"],
        help=(
            "Which references to evaluate besides the arms (a short session may leave out the base, 0%% on 2026-12-01)."
        ),
    )
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="LABEL=RUN_DIR",
        help="A GRPO run to evaluate (its adapter/ on the SFT model), repeatable.",
    )
    ap.add_argument(
        "--full-model",
        action="append",
        default=[],
        metavar="LABEL=MODEL_DIR",
        help="A full-weight model to evaluate as it is (e.g. SFT given the arms' extra minutes), repeatable.",
    )
    ap.add_argument(
        "--demonstrator",
        action="store_true",
        help="Also play train.sft.demonstrator on the same mazes (paired with every model).",
    )
    ap.add_argument(
        "--adversarial-arms",
        nargs="*",
        default=None,
        metavar="LABEL",
        help="Only these arms on the adversarial split (default: all).",
    )
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    work, out = Path(args.work), Path(args.out)
    console = Console(width=140)
    config = load_config(args.config, args.overrides)
    arms = dict(a.split("=", 1) for a in args.arm) or {
        "grpo": str(Path(config.storage.root) / (config.storage.run_name or ""))
    }
    references = [
        m for m in [("base", str(work / "model"), None), ("sft", str(work / "sft-model"), None)] if m[0] in args.models
    ]
    full = dict(a.split("=", 1) for a in args.full_model)
    references += [(label, path, None) for label, path in full.items()]
    report: dict = {"config": args.config, "overrides": args.overrides, "arms": arms, "splits": {}}
    for split in args.splits:
        t0 = time.perf_counter()
        n = getattr(config.env, split).count
        chosen = (
            arms
            if split == "holdout" or args.adversarial_arms is None
            else {k: v for k, v in arms.items() if k in args.adversarial_arms}
        )
        models = references + [
            (label, str(work / "sft-model"), str(Path(run) / "adapter")) for label, run in chosen.items()
        ]
        results = evaluate_models(config, models, split=split, limit=n, greedy=True, out_dir=out / f"eval-{split}")
        if args.demonstrator:  # the demonstrator's own play on the same mazes, paired like a model
            from vlrl.envs.base import build_split
            from vlrl.training.sft import demonstrator_result

            walk = demonstrator_result(config, build_split(config.env, split)[:n], label="demonstrator")
            walk.split = split
            results.append(walk)
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
            "paired": {
                f"{a}_vs_{b}": pair_results(by[a], by[b]).to_json()
                for a, b in paired_order(list(chosen), list(full), args.demonstrator)
                if a in by and b in by
            },
        }
        if split == "adversarial":
            entry["by_variant"] = {r.label: by_variant(r) for r in results}
            for label, rows in entry["by_variant"].items():
                console.print(
                    f"[bold]{label}[/] by variant: "
                    + "; ".join(f"{k} {100 * v['success_rate']:.0f}% (n={v['n']})" for k, v in rows.items())
                )
        report["splits"][split] = entry
    holdout = report["splits"].get("holdout", {}).get("summaries", {})
    named = [("base", "base"), ("SFT (start)", "sft"), *((label, label) for label in full), ("demonstrator",) * 2]
    bands = {name: holdout[label] for name, label in named if label in holdout}
    report["learning_curves"] = {}
    for label, run in arms.items():
        run = Path(run)
        evals = json.loads((run / "evals.json").read_text()) if (run / "evals.json").exists() else []
        if evals and (run / "metrics.jsonl").exists():
            history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            learning_curve(
                history,
                evals,
                out / f"learning_curve-{label}.png",
                baselines=bands,
                title=f"GRPO ({label}) on 9x9 block mazes (maze9, one H200)",
            )
        report["learning_curves"][label] = [
            {"step": e["step"], "success_rate": e["success_rate"], "n": e["n"]} for e in evals
        ]
    (out / "gpu_maze9_eval.json").write_text(json.dumps(report, indent=1))
    for key, vs in report["splits"].get("holdout", {}).get("paired", {}).items():
        console.print(f"holdout {key}: {json.dumps(vs)}")


def paired_order(arms: list[str], full: list[str] = (), demonstrator: bool = False) -> list[tuple[str, str]]:
    """Which pairs get the paired test: each arm against SFT and the base, SFT against the base,
    the arms against each other, each arm against each full model (GRPO against more SFT: the
    equal-compute A/B), the full models against SFT, and everything against the demonstrator."""
    pairs = [(a, "sft") for a in arms] + [("sft", "base")] + [(a, "base") for a in arms]
    pairs += [(a, b) for i, a in enumerate(arms) for b in arms[i + 1 :]]
    pairs += [(a, f) for a in arms for f in full] + [(f, "sft") for f in full]
    if demonstrator:
        pairs += [(m, "demonstrator") for m in [*arms, *full, "sft"]]
    return pairs


if __name__ == "__main__":
    main()
