"""Helpers for the tracking tests: adapters with lineage, evaluation summaries, registry snapshots."""

from __future__ import annotations

import shutil
from pathlib import Path

from vlrl.config import RunConfig
from vlrl.envs.base import build_split, split_version
from vlrl.eval.evaluate import EvalResult, task_key
from vlrl.eval.protocol import model_identity, tasks_hash
from vlrl.tracking.lineage import collect_lineage, write_adapter_lineage


def make_adapter(
    config: RunConfig, out: Path, seed: int, base_fingerprint: str | None = None, init_adapter: str | None = None
) -> Path:
    """A real LoRA adapter on config.model.path (fresh weights from `seed`) with a lineage as a run
    directory `out.parent` would record it. `base_fingerprint` overrides the recorded base."""
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import load_policy_model
    from vlrl.models.lora import apply_lora, save_adapter

    model = load_policy_model(config.model.path)
    peft = apply_lora(model, config.model.lora.rank, config.model.lora.alpha, seed=seed)
    for name, p in peft.named_parameters():  # B = 0 at init: give the adapter distinct, nonzero weights
        if "lora_B" in name:
            p.data.fill_(0.001 * (seed + 1))
    save_adapter(peft, out, base_fingerprint or model_fingerprint(config.model.path))
    write_adapter_lineage(out, collect_lineage(config, out.parent, init_adapter=init_adapter))
    return out


def write_eval(
    out_dir: Path, config: RunConfig, label: str, adapter: Path | None, split: str, successes: int, n: int
) -> Path:
    """An evaluation summary as `vlrl eval -o out_dir` writes it, for the first n tasks of `split`,
    with the given number of successes, on the first tasks (the identity, task hash and task keys
    are the real ones, so two such summaries pair task by task: the one with more successes solved
    every task the other solved)."""
    tasks = list(build_split(config.env, split))[:n]
    episodes = [
        {
            "success": float(i < successes),
            "turns": 2.0,
            "optimal_turns": 2.0,
            "invalid_actions": 0.0,
            "group": "3x3",
            "task_id": t.task_id,
            "task_key": task_key(t),
        }
        for i, t in enumerate(tasks)
    ]
    meta = {
        "split_version": split_version(config.env, split),
        "tasks_hash": tasks_hash(tasks),
        "env": config.env.name,
        "model": model_identity(config.model.path, str(adapter) if adapter else None),
    }
    return EvalResult(label, split, "greedy", episodes, [], meta).save(out_dir / label)


def copy_db(db: Path, dest_dir: Path) -> Path:
    """A private copy of an MLflow SQLite database (tables already created: fast to open)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(db, dest_dir / "mlflow.db"))


def snapshot(registry) -> dict:
    """Everything a registry command could change: per model its tags, aliases and version tags."""
    client = registry.client
    out = {}
    for m in client.search_registered_models():
        versions = {str(v.version): dict(v.tags) for v in client.search_model_versions(f"name='{m.name}'")}
        out[m.name] = {"tags": dict(m.tags), "aliases": dict(m.aliases), "versions": versions}
    return out
