"""The evaluation protocol: base vs SFT vs GRPO adapters on the same tasks of one split.

Each model is loaded fresh (base weights + its adapter, or none for the base) and plays one
episode per task with the same decoding (greedy, sampled, or both). Three guards run before any
model is loaded:

1. no evaluated task of a held-out split shares anything with the training split: for the maze,
   no wall layout (walls alone, mirrored and rotated copies included; `splits.train_overlap`),
   so a held-out maze is never a known wall layout with a new start and goal;
2. no model is evaluated on a split it was trained on: an adapter's (or full SFT model's)
   lineage records its training split's version and seed range; evaluating on that split, or on
   tasks whose seeds fall in that range, is refused unless `force=True` (`vlrl eval --force`);
3. every adapter was trained on the base model it is about to be loaded on (fingerprints).

Each result records exactly what was evaluated (model and adapter fingerprints, the split's
version and a hash of the task list), so the registry can tell whether two evaluations are
comparable, and `out_dir/<label>/` keeps summary.json (with every task's outcome) and
traces.jsonl for independent re-checks (`vlrl eval-verify`). All models play the same tasks, so
`out_dir/paired.json` compares every two of them (same decoding) task by task: discordant counts,
the paired difference with its 95% interval and McNemar's exact p-value (`eval.evaluate.paired_table`).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from vlrl.config import RunConfig
from vlrl.envs.base import Task, build_split, env_class, overlapping_tasks, split_version
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import EvalResult, evaluate_engine, pair_results, result_pairs

DECODINGS = ("greedy", "sampled")


def check_disjoint_from_train(config: RunConfig, tasks: list) -> None:
    """Refuse to evaluate on tasks that share content with the training split.

    Environments that can answer without listing the training split (the maze: whether train owns
    the task's wall layout) implement `train_overlap`; for others (it returns None) the tasks are
    compared with every training task by content hash.
    """
    found = env_class(config.env.name).train_overlap(config.env, list(tasks))
    if found is not None:
        overlap = [t.task_id for t in found]
    else:
        overlap = [a.task_id for a, _ in overlapping_tasks(list(tasks), build_split(config.env, "train"))]
    if overlap:
        raise VlrlError(
            f"{len(overlap)} evaluation task(s) also appear in the training split (the same wall layout "
            f"counts), e.g. {overlap[0]}"
        )


def tasks_hash(tasks: list[Task]) -> str:
    """16 hex digits of sha256 over the task list (ids, seeds, params), to tell whether two
    evaluations played the same tasks."""
    blob = json.dumps([t.to_json() for t in tasks], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def training_record(path: str | Path) -> dict[str, Any] | None:
    """What an adapter or model directory says about its training data, or None when nothing.

    {"split": {seed_start, seed_end, version} or None, "source": file}: from vlrl_lineage.json, or
    from vlrl_sft.json (a full SFT model: trained on a train split whose range is not recorded).
    """
    from vlrl.tracking.lineage import ADAPTER_LINEAGE_FILE, read_adapter_lineage, trained_split

    p = Path(path)
    lineage = read_adapter_lineage(p)
    if lineage is not None:
        return {"split": trained_split(lineage), "source": str(p / ADAPTER_LINEAGE_FILE)}
    if (p / "vlrl_sft.json").is_file():
        return {"split": None, "source": str(p / "vlrl_sft.json")}
    return None


def check_not_trained_on(config: RunConfig, split: str, tasks: list[Task], path: str | Path, label: str) -> None:
    """Refuse to evaluate `label` (an adapter or model dir) on the split, or the seeds, it was trained on."""
    record = training_record(path)
    if record is None:
        return
    hint = "evaluate on holdout or adversarial, or pass --force to evaluate anyway"
    trained = record["split"]
    if trained is None:
        if split == "train":
            raise VlrlError(f"{label} was trained on the train split (per {record['source']}); {hint}")
        return
    if split_version(config.env, split) == trained.get("version"):
        raise VlrlError(
            f"{label} was trained on this {split} split (version {trained.get('version')}, per its lineage); {hint}"
        )
    lo, hi = trained.get("seed_start", 0), trained.get("seed_end", 0)
    inside = [t for t in tasks if lo <= t.seed < hi]
    if inside:
        raise VlrlError(
            f"{len(inside)} of the {len(tasks)} {split} tasks use seeds of {label}'s training split [{lo}, {hi}) "
            f"(e.g. {inside[0].task_id}); {hint}"
        )


def model_identity(model_dir: str | Path, adapter_dir: str | None) -> dict[str, Any]:
    """What a (model, adapter) pair is: paths and fingerprints, and the adapter's training run."""
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.tracking.lineage import adapter_info

    identity: dict[str, Any] = {
        "path": str(Path(model_dir).resolve()),
        "base_fingerprint": model_fingerprint(model_dir),
        "adapter_path": None,
        "adapter_fingerprint": None,
    }
    if adapter_dir is not None:
        info = adapter_info(adapter_dir)
        if info["base_fingerprint"] != identity["base_fingerprint"]:
            raise VlrlError(
                f"adapter {adapter_dir} was trained on base model {info['base_fingerprint']}, but the base model "
                f"{model_dir} is {identity['base_fingerprint']}; pass the matching --model"
            )
        identity.update(
            {
                "adapter_path": info["path"],
                "adapter_fingerprint": info["fingerprint"],
                "run_dir": info.get("run_dir"),
                "mlflow_run_id": info.get("mlflow_run_id"),
            }
        )
    return identity


def load_engine(config: RunConfig, adapter_dir: str | None):
    """A model (`config.model.path` + optional adapter) with a transformers engine and its chat format."""
    from vlrl.models.loading import ensure_model, load_policy_model, worker_device
    from vlrl.models.lora import load_adapter
    from vlrl.models.processor import load_processor
    from vlrl.rollout.factory import build_engine
    from vlrl.rollout.sequence import ChatFormat

    model_dir = ensure_model(config.model)
    processor = load_processor(model_dir)
    chat = ChatFormat(processor)
    model = load_policy_model(
        model_dir,
        dtype=config.model.dtype,
        attn_implementation=config.model.attn_implementation,
        device=worker_device(config),
    )
    if adapter_dir:
        model = load_adapter(model, adapter_dir)
    return build_engine(config, chat, model, engine="transformers"), chat


def result_dir_name(label: str, decoding: str) -> str:
    """The folder of one result under out_dir: the label ('/' -> '_'), with '-sampled' for sampling."""
    name = label.replace("/", "_")
    return name if decoding == "greedy" else f"{name}-sampled"


def evaluate_models(
    config: RunConfig,
    models: list[tuple[str, str | None, str | None]],
    *,
    split: str = "holdout",
    limit: int | None = None,
    greedy: bool = True,
    out_dir: str | Path | None = None,
    decodings: list[str] | tuple[str, ...] | None = None,
    force: bool = False,
) -> list[EvalResult]:
    """Evaluate (label, model_dir or None, adapter_dir or None) on the first `limit` tasks of `split`.

    A model_dir of None means `config.model.path`; an adapter of None means the bare model.
    `decodings` ("greedy", "sampled" or both) defaults to greedy, or sampled when `greedy` is False.
    With `out_dir`, each result is saved to out_dir/<label>[-sampled]/ and out_dir/results.json
    lists every summary. `force` skips only guard 2 (evaluating on a model's own training split).
    """
    from vlrl.models.loading import ensure_model

    if split not in ("train", "holdout", "adversarial"):
        raise VlrlError(f"unknown split '{split}': use holdout, adversarial or train")
    decodings = tuple(decodings or (("greedy",) if greedy else ("sampled",)))
    unknown = [d for d in decodings if d not in DECODINGS]
    if unknown:
        raise VlrlError(f"unknown decoding {unknown[0]!r}: use greedy, sampled or both")
    labels = [label for label, _, _ in models]
    if len(set(labels)) != len(labels):
        raise VlrlError(f"two models share a label in {labels}; labels name the output folders")
    all_tasks = build_split(config.env, split)
    tasks = [all_tasks[i] for i in range(min(limit or len(all_tasks), len(all_tasks)))]
    if split != "train":
        check_disjoint_from_train(config, tasks)
    for label, model_dir, adapter in models:
        if adapter is not None and not Path(adapter).is_dir():
            raise VlrlError(f"adapter {adapter} is not a directory")
        if model_dir is not None and not Path(model_dir).is_dir():
            raise VlrlError(f"model {model_dir} is not a directory")
        if not force:
            if adapter is not None:
                check_not_trained_on(config, split, tasks, adapter, f"adapter {label}")
            if model_dir is not None:
                check_not_trained_on(config, split, tasks, model_dir, f"model {label}")
    if not force and any(model_dir is None for _, model_dir, _ in models) and Path(config.model.path).is_dir():
        check_not_trained_on(config, split, tasks, config.model.path, f"model {config.model.path}")
    common = {
        "split_version": split_version(config.env, split),
        "tasks_hash": tasks_hash(tasks),
        "env": config.env.name,
        "evaluated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    plans = []
    for label, model_dir, adapter in models:
        cfg = (
            config
            if model_dir is None
            else config.model_copy(update={"model": config.model.model_copy(update={"path": str(model_dir)})})
        )
        plans.append(
            (label, cfg, adapter, model_identity(ensure_model(cfg.model), adapter))
        )  # guard 3 before any loading
    results = []
    for label, cfg, adapter, identity in plans:
        engine, chat = load_engine(cfg, adapter)
        for decoding in decodings:
            result = evaluate_engine(
                engine, chat, config, tasks, greedy=decoding == "greedy", label=label, seed=config.train.seed
            )
            result.meta = {**common, "model": identity}
            if out_dir is not None:
                result.save(Path(out_dir) / result_dir_name(label, decoding))
            results.append(result)
    if out_dir is not None:
        index = [
            {"dir": result_dir_name(r.label, "greedy" if r.decoding == "greedy" else "sampled"), **r.summary()}
            for r in results
        ]
        (Path(out_dir) / "results.json").write_text(json.dumps(index, indent=1))
        paired = [
            {"a": a.label, "b": b.label, "decoding": a.decoding, **pair_results(a, b).to_json()}
            for a, b in result_pairs(results)
        ]
        if paired:
            (Path(out_dir) / "paired.json").write_text(json.dumps(paired, indent=1))
    return results
