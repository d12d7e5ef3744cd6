"""The evaluation protocol: base vs SFT vs GRPO adapters on the same tasks of one split.

Each model is loaded fresh (base weights + its adapter, or none for the base) and plays one
episode per task with the same decoding. Before a held-out split is used, its tasks are checked
against the training split by maze content, so a result can never come from a training maze.
"""

from __future__ import annotations

from pathlib import Path

from vlrl.config import RunConfig
from vlrl.envs.base import build_split, env_class, overlapping_tasks
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import EvalResult, evaluate_engine


def check_disjoint_from_train(config: RunConfig, tasks: list) -> None:
    """Refuse to evaluate on tasks whose content also appears in the training split.

    Environments that can answer without listing the training split (the maze: by its content
    buckets) provide `train_overlap`; others are compared with every training task.
    """
    cls = env_class(config.env.name)
    if hasattr(cls, "train_overlap"):
        overlap = [t.task_id for t in cls.train_overlap(config.env, list(tasks))]
    else:
        overlap = [a.task_id for a, _ in overlapping_tasks(list(tasks), build_split(config.env, "train"))]
    if overlap:
        raise VlrlError(f"{len(overlap)} evaluation task(s) also appear in the training split, e.g. {overlap[0]}")


def load_engine(config: RunConfig, adapter_dir: str | None):
    """A model (`config.model.path` + optional adapter) with a transformers engine and its chat format."""
    from vlrl.models.loading import load_policy_model, vision_special_token_ids
    from vlrl.models.lora import load_adapter
    from vlrl.models.processor import load_processor
    from vlrl.rollout.hf_engine import TransformersEngine
    from vlrl.rollout.sequence import ChatFormat
    from vlrl.training.worker import ensure_model

    model_dir = ensure_model(config)
    processor = load_processor(model_dir)
    chat = ChatFormat(processor)
    model = load_policy_model(model_dir, dtype=config.model.dtype, attn_implementation=config.model.attn_implementation)
    if adapter_dir:
        model = load_adapter(model, adapter_dir)
    tok = processor.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else chat.eos_id
    engine = TransformersEngine(model, tok, vision_special_token_ids(processor), eos_token_id=chat.eos_id,
                                pad_token_id=pad, batch_size=config.rollout.batch_size)
    return engine, chat


def evaluate_models(
    config: RunConfig,
    models: list[tuple[str, str | None, str | None]],
    *,
    split: str = "holdout",
    limit: int | None = None,
    greedy: bool = True,
    out_dir: str | Path | None = None,
) -> list[EvalResult]:
    """Evaluate (label, model_dir or None, adapter_dir or None) on the first `limit` tasks of `split`.

    A model_dir of None means `config.model.path`; an adapter of None means the bare model.
    """
    if split not in ("train", "holdout", "adversarial"):
        raise VlrlError(f"unknown split '{split}': use holdout, adversarial or train")
    all_tasks = build_split(config.env, split)
    tasks = [all_tasks[i] for i in range(min(limit or len(all_tasks), len(all_tasks)))]
    if split != "train":
        check_disjoint_from_train(config, tasks)
    for _, model_dir, adapter in models:
        if adapter is not None and not Path(adapter).is_dir():
            raise VlrlError(f"adapter {adapter} is not a directory")
        if model_dir is not None and not Path(model_dir).is_dir():
            raise VlrlError(f"model {model_dir} is not a directory")
    results = []
    for label, model_dir, adapter in models:
        cfg = config if model_dir is None else config.model_copy(update={"model": config.model.model_copy(update={"path": str(model_dir)})})
        engine, chat = load_engine(cfg, adapter)
        result = evaluate_engine(engine, chat, config, tasks, greedy=greedy, label=label, seed=config.train.seed)
        if out_dir is not None:
            result.save(Path(out_dir) / label.replace("/", "_"))
        results.append(result)
    return results
