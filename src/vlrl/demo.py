"""The embedded demo, end to end on a CPU: what `make demo` runs.

    build the demo model offline -> [pretrain its vision tower on square labels, when
    train.vision_pretrain.in_demo] -> SFT on an imperfect demonstrator's transcripts
    (train.sft.demonstrator: one of the maze's depth-first walkers) -> GRPO with LoRA -> evaluate base,
    demonstrator-SFT and GRPO on the holdout split, and the demonstrator itself on the same tasks
    -> table with 95% intervals, paired comparisons on the same tasks (McNemar's exact test) -> plot

Where the oracle is free and perfect, "GRPO beats its SFT start" only measures how early SFT was
stopped. Against an imperfect demonstrator the question is the one RL answers: does GRPO learn
what imitating the demonstrator cannot give (here: not to walk into dead ends the image shows)?

Everything lands in one directory (default runs/demo): the model, both adapters, the GRPO run
(config, metrics.jsonl, checkpoints), evaluation summaries and traces, demo.json and the plot.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

from rich.console import Console

from vlrl.config import RunConfig
from vlrl.envs.base import build_split
from vlrl.eval.evaluate import format_p, pair_results, paired_table, results_table
from vlrl.eval.protocol import evaluate_models
from vlrl.models.loading import ensure_model
from vlrl.report.plots import learning_curve
from vlrl.training.progress import train_with_progress
from vlrl.training.sft import demonstrator_result, reached_target, run_sft
from vlrl.training.vision_pretrain import pretrain_vision


def peak_memory_mb() -> float:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_demo(config: RunConfig, out: str | Path, console: Console | None = None) -> dict:
    console = console or Console()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    timings: dict[str, float] = {}

    def phase(name: str, t0: float) -> None:
        timings[name] = round(time.perf_counter() - t0, 1)
        console.print(f"[green]done[/] {name} in {timings[name]:.1f}s")

    t0 = time.perf_counter()
    with console.status(f"building the {config.model.init_tiny or ''} model at {config.model.path}"):
        model_dir = ensure_model(config.model)
    phase("model", t0)

    seeing = config.train.vision_pretrain.in_demo
    stages = 4 if seeing else 3
    if seeing:
        # A real checkpoint's vision tower already sees; the random tiny one learns to first, from square labels
        # alone (no paths, no actions), so what SFT and GRPO learn afterwards is acting on what it sees.
        console.rule(f"1/{stages} vision pretraining: {config.train.vision_pretrain.steps} steps on square labels")
        t0 = time.perf_counter()
        with console.status("pretraining the vision tower"):
            model_dir = pretrain_vision(config, out / "seeing-model", overwrite=True)
        config = config.model_copy(deep=True)
        config.model.path, config.model.init_tiny = str(model_dir), None
        phase("vision", t0)

    who = config.train.sft.demonstrator
    console.rule(f"{stages - 2}/{stages} SFT warm start on {who} transcripts")
    t0 = time.perf_counter()
    from rich.progress import Progress

    with Progress(console=console) as bar:
        task = bar.add_task("SFT", total=None)
        # The demo's directory is its own: a second `make demo` replaces the first one's warm start.
        sft_dir = run_sft(
            config,
            out / "sft-adapter",
            lambda s, n, loss: bar.update(task, completed=s, total=n, description=f"SFT loss {loss:.3f}"),
            overwrite=True,
        )
        sft_history = json.loads((Path(sft_dir) / "sft_history.json").read_text())
        sft_steps = len(sft_history)
        if reached_target(sft_history, config.train.sft.target_loss):  # stopped early: say so, and fill the bar
            bar.update(
                task,
                completed=sft_steps,
                total=sft_steps,
                description=f"SFT reached its loss target {config.train.sft.target_loss} at step {sft_steps}",
            )
    phase("sft", t0)

    # GRPO starts where SFT ended: on the SFT model (full mode) or from the SFT adapter (LoRA mode).
    full = config.train.sft.mode == "full"
    grpo_config = config.model_copy(deep=True)
    if full:
        grpo_config.model.path, grpo_config.model.init_tiny = str(sft_dir), None
    console.rule(f"{stages - 1}/{stages} GRPO with LoRA from the SFT {'model' if full else 'adapter'}")
    t0 = time.perf_counter()
    grpo_dir = train_with_progress(
        grpo_config, out / "grpo", init_adapter=None if full else str(sft_dir), console=console
    )
    phase("grpo", t0)

    n_eval = config.env.holdout.count
    console.rule(f"{stages}/{stages} evaluation on {n_eval} holdout tasks (greedy), and the {who} on the same tasks")
    t0 = time.perf_counter()
    if full:
        models = [("base", None, None), ("sft", str(sft_dir), None), ("grpo", str(sft_dir), str(grpo_dir))]
    else:
        models = [("base", None, None), ("sft", None, str(sft_dir)), ("grpo", None, str(grpo_dir))]
    with console.status("evaluating base, SFT and GRPO"):
        results = evaluate_models(config, models, split="holdout", limit=n_eval, greedy=True, out_dir=out / "eval")
        holdout = build_split(config.env, "holdout")
        tasks = [holdout[i] for i in range(min(n_eval, len(holdout)))]
        results.insert(1, demonstrator_result(config, tasks, label="demonstrator"))
    phase("eval", t0)

    console.print(results_table(results, title=f"holdout split, {results[0].summary()['n']} tasks"))
    console.print(paired_table(results, title="paired on the same tasks (b, c: tasks only A, only B solved)"))
    summaries = {r.label: r.summary() for r in results}
    by_label = {r.label: r for r in results}
    paired = {
        f"{a}_vs_{b}": pair_results(by_label[a], by_label[b])
        for a, b in (
            ("sft", "base"),
            ("grpo", "base"),
            ("grpo", "sft"),
            ("sft", "demonstrator"),
            ("grpo", "demonstrator"),
        )
    }
    history = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    evals = json.loads((out / "grpo" / "evals.json").read_text())
    plot = learning_curve(
        history,
        evals,
        out / "learning_curve.png",
        baselines={
            "base": summaries["base"],
            f"SFT on the {who} (start)": summaries["sft"],
            f"the {who} itself": summaries["demonstrator"],
        },
    )
    gain = summaries["grpo"]["success_rate"] - summaries["sft"]["success_rate"]
    separated = summaries["grpo"]["success_low"] > summaries["sft"]["success_high"]
    report = {
        "model": str(model_dir),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "phase_s": timings,
        "sft_steps": sft_steps,
        "demonstrator": who,
        "peak_memory_mb": round(peak_memory_mb(), 1),
        "summaries": summaries,
        "grpo_minus_sft_pp": round(100 * gain, 1),
        "grpo_minus_demonstrator_pp": round(
            100 * (summaries["grpo"]["success_rate"] - summaries["demonstrator"]["success_rate"]), 1
        ),
        "intervals_separated": separated,
        "paired": {k: v.to_json() for k, v in paired.items()},
        "plot": str(plot),
    }
    (out / "demo.json").write_text(json.dumps(report, indent=1))
    vs_sft, vs_demo = paired["grpo_vs_sft"], paired["grpo_vs_demonstrator"]
    console.print(
        f"GRPO vs its SFT start (SFT on the {who}): {vs_sft.format_difference()} points, paired on the same tasks "
        f"(only GRPO solved {vs_sft.only_a}, only SFT {vs_sft.only_b}; McNemar p = {format_p(vs_sft.p_value)}; "
        f"Wilson intervals {'do not overlap' if separated else 'overlap'}); GRPO vs the {who} itself: "
        f"{vs_demo.format_difference()} points (p = {format_p(vs_demo.p_value)}); "
        f"wall time {report['wall_time_s']:.0f}s, peak memory {report['peak_memory_mb']:.0f} MB; plot {plot}"
    )
    return report
