"""SFT warm start: behaviour cloning of a demonstrator, multi-turn, with LoRA or full weights.

Transcripts are played by `train.sft.demonstrator` turn by turn on training tasks: the env's oracle
(`env.oracle_response()`, any env), or an imperfect demonstrator of the env
(`env.start_demonstrator(name, rng)` then `env.demonstrator_response()`; the maze's depth-first
walkers, envs/maze/walker.py), whose success is measured and recorded in the lineage first.
With `train.sft.noise > 0` a share of turns takes a random response instead
(`env.random_response(rng)`; the maze: a random move), so transcripts also show how to recover
from a mistake; those random turns carry no loss (the model must not clone them).
The loss is the mean negative log-likelihood of the demonstrator's response tokens. With
`train.sft.target_loss` the warm start ends once the loss has come down that far: a random tiny
model learns to see the maze in a sudden drop of the loss whose step varies with the batch order,
so a loss target gives the same competence where a step count would not.

It gives the tiny demo model the weak starting competence a pretrained model would have, and it
is the SFT baseline that evaluation compares GRPO against.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch

from vlrl.algo.grpo import token_logprobs
from vlrl.config import RunConfig
from vlrl.envs.base import Task, build_split, env_class, make_env, task_group_label
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import EvalResult, episode_row
from vlrl.models.output import check_output_dir
from vlrl.models.qwen_vl_batched import FORWARD_KEYS, spatial_merge_size, with_position_ids
from vlrl.rollout.sequence import ChatFormat, MultimodalSequence, collate

log = logging.getLogger(__name__)


def demonstrator_rng(config: RunConfig, task: Task) -> random.Random:
    """The rng of a stochastic demonstrator's episode: the same task and train.seed, the same walk."""
    return random.Random(f"demonstrator/{config.train.seed}/{task.seed}")


def start_episode(config: RunConfig, env, task: Task):
    """Reset `env` on `task` and start train.sft.demonstrator on it; returns the first observation."""
    obs = env.reset(task)
    name = config.train.sft.demonstrator
    if name != "oracle":
        env.start_demonstrator(name, demonstrator_rng(config, task))
    return obs


def demonstrator_response(config: RunConfig, env) -> str:
    """The response of train.sft.demonstrator at the env's current state."""
    return env.oracle_response() if config.train.sft.demonstrator == "oracle" else env.demonstrator_response()


def oracle_transcript(config: RunConfig, chat: ChatFormat, task: Task, rng: random.Random) -> MultimodalSequence:
    """One demonstrator-played episode (train.sft.demonstrator: the oracle by default) as a token
    sequence; the demonstrator's turns have loss mask 1."""
    env = make_env(config.env)
    seq = chat.prompt(env.system_prompt, start_episode(config, env, task))
    for _ in range(config.env.max_turns):
        noisy = config.train.sft.noise > 0 and rng.random() < config.train.sft.noise
        text = env.random_response(rng) if noisy else demonstrator_response(config, env)
        ids = chat.response_ids(text)
        if noisy:
            seq.extend(MultimodalSequence(ids, [0] * len(ids), [0.0] * len(ids), [0] * len(ids)))
        else:
            seq.append_sampled(ids, [0.0] * len(ids))
        result = env.step(text)
        if result.done:
            break
        seq.extend(chat.observation_piece(result.observation, response_ended=True))
    return seq


DEMONSTRATOR_CHECK_TASKS = 500  # tasks the demonstrator plays (without images) to measure its success


def check_demonstrator_exists(config: RunConfig) -> None:
    """One error line when the env has no demonstrator of train.sft.demonstrator's name."""
    name = config.train.sft.demonstrator
    has = env_class(config.env.name).demonstrators
    if name != "oracle" and name not in has:
        raise VlrlError(
            f"train.sft.demonstrator = {name!r}: env '{config.env.name}' has "
            + (f"only the oracle and {', '.join(has)}" if has else "no demonstrator but its oracle")
            + "; set train.sft.demonstrator=oracle"
        )


def play_demonstrator(config: RunConfig, task: Task) -> dict[str, float]:
    """One episode of train.sft.demonstrator on `task` (no images where the env can skip them); its metrics."""
    cls = env_class(config.env.name)
    try:
        env = cls(config.env, render_images=False)
    except TypeError:  # an env that always renders
        env = make_env(config.env)
    start_episode(config, env, task)
    for _ in range(config.env.max_turns):
        if env.step(demonstrator_response(config, env)).done:
            break
    return env.episode_metrics()


def demonstrator_result(config: RunConfig, tasks: list[Task], label: str | None = None) -> EvalResult:
    """train.sft.demonstrator's own episodes on `tasks`, as an evaluation result (decoding "greedy":
    paired task by task with the models' greedy results)."""
    name = config.train.sft.demonstrator
    episodes = [episode_row(play_demonstrator(config, t), t) for t in tasks]
    return EvalResult(label or name, "holdout", "greedy", episodes, meta={"demonstrator": name})


def check_demonstrator(config: RunConfig, tasks: list[Task]) -> dict:
    """Whether train.sft.demonstrator exists for the env, and its success on (up to 500 of) `tasks`.

    An env without the demonstrator is one error line. A demonstrator that fails some tasks within
    env.max_turns is no error (the walker is meant to be imperfect): a warning gives the share it
    failed, per task group (the maze: per size), and SFT goes on imitating it, failures included.
    Returns {"name", "tasks", "success_rate", "by_group"} for the lineage.
    """
    check_demonstrator_exists(config)
    name = config.train.sft.demonstrator
    by_group: dict[str, list[int]] = {}
    for row in demonstrator_result(config, tasks[:DEMONSTRATOR_CHECK_TASKS]).episodes:
        counts = by_group.setdefault(row["group"], [0, 0])
        counts[0] += int(row["success"] > 0)
        counts[1] += 1
    for group, (ok, n) in sorted(by_group.items()):
        if ok < n:
            log.warning(
                "train.sft.demonstrator %s fails %.1f%% of %d SFT tasks (%s %s) within env.max_turns=%d; SFT goes on "
                "and imitates those episodes too",
                name,
                100 * (n - ok) / n,
                n,
                task_group_label(config.env.name),
                group,
                config.env.max_turns,
            )
    total = sum(n for _, n in by_group.values())
    return {
        "name": name,
        "tasks": total,
        "success_rate": sum(ok for ok, _ in by_group.values()) / max(1, total),
        "by_group": {g: ok / n for g, (ok, n) in sorted(by_group.items())},
    }


def sft_loss(model, batch: dict[str, torch.Tensor], suppress: list[int]) -> torch.Tensor:
    """Mean NLL of the masked tokens, with the same vision-token suppression as sampling."""
    logits = model(**{k: batch[k] for k in FORWARD_KEYS if k in batch}, use_cache=False).logits[:, :-1]
    logp = token_logprobs(logits, batch["input_ids"][:, 1:], 1.0, suppress)
    mask = batch["loss_mask"][:, 1:]
    # Prompt positions may hold suppressed vision tokens (log-prob -inf): select, don't multiply.
    return -torch.where(mask > 0, logp, 0.0).sum() / mask.sum().clamp(min=1)


def lr_factor(step: int, schedule: str, warmup: int, total: int, time_fraction: float = 0.0) -> float:
    """The learning-rate multiplier at optimizer step `step`: linear warm-up, then the schedule.

    `time_fraction` (the share of `train.sft.max_minutes` used so far): a decaying schedule runs
    on whichever of steps and time is further along, so that a run the budget ends has decayed
    its rate by then instead of stopping at full rate.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, max((step - warmup) / max(1, total - warmup), time_fraction))
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


class TranscriptBatches:
    """Collated batches of oracle transcripts, epoch by epoch.

    Without workers every transcript is played once, up front, and reused each epoch (noise
    included), as the CPU demo has always done. With workers each batch is played and tokenized
    in a worker process while the model trains on the previous one; the noise of a transcript
    then depends on (seed, epoch, task), so a run is reproducible whatever the worker count.
    """

    def __init__(
        self, config: RunConfig, chat: ChatFormat, tasks: list[Task], pad_id: int, merge_size: int | None = None
    ):
        """`merge_size` (the model's `spatial_merge_size`): batches also carry their M-RoPE
        position ids, computed where the batch is built (in the workers, off the training loop)."""
        self.config, self.chat, self.tasks, self.pad_id, self.merge_size = config, chat, tasks, pad_id, merge_size
        self._cached: list[MultimodalSequence] | None = None

    def _collate(self, seqs: list[MultimodalSequence]) -> dict[str, torch.Tensor]:
        return with_position_ids(collate(seqs, self.pad_id, side="right"), self.merge_size)

    def epoch(self, epoch: int, rng: random.Random, workers: int) -> Iterator[dict[str, torch.Tensor]]:
        size = self.config.train.sft.batch_size
        if workers == 0:
            if self._cached is None:
                self._cached = [oracle_transcript(self.config, self.chat, t, rng) for t in self.tasks]
            order = list(range(len(self.tasks)))
            rng.shuffle(order)
            for b in range(0, len(order), size):
                yield self._collate([self._cached[i] for i in order[b : b + size]])
            return
        order = list(range(len(self.tasks)))
        rng.shuffle(order)
        loader = torch.utils.data.DataLoader(
            [order[b : b + size] for b in range(0, len(order), size)],
            batch_size=None,
            shuffle=False,
            num_workers=workers,
            collate_fn=partial(self._play_batch, epoch=epoch),
            prefetch_factor=4,
            persistent_workers=False,
        )
        yield from loader

    def _play_batch(self, indices: list[int], epoch: int) -> dict[str, torch.Tensor]:
        torch.set_num_threads(1)  # many small workers, not one that takes every core
        try:
            seqs = [
                oracle_transcript(
                    self.config, self.chat, self.tasks[i], random.Random(f"{self.config.train.seed}/{epoch}/{i}")
                )
                for i in indices
            ]
        except StopIteration as exc:
            # The DataLoader's worker takes a StopIteration from collate_fn for the end of the data and
            # would end the epoch after this batch without a word; it is a bug in a demonstrator.
            raise RuntimeError(f"playing SFT transcripts {indices[:4]}...: StopIteration ({exc!r})") from exc
        return self._collate(seqs)


TARGET_WINDOW = 20  # steps averaged for train.sft.target_loss


def reached_target(history: list[dict], target: float | None) -> bool:
    """Whether the mean loss of the last TARGET_WINDOW steps is below `target` (never if None)."""
    if target is None or len(history) < TARGET_WINDOW:
        return False
    return sum(h["loss"] for h in history[-TARGET_WINDOW:]) / TARGET_WINDOW < target


def save_full_model(
    model,
    base_dir: Path,
    out_dir: str | Path,
    base_fingerprint: str,
    record_file: str = "vlrl_sft.json",
    record: dict | None = None,
) -> Path:
    """Write a fully fine-tuned model as a new base: weights + config, the base's tokenizer and
    processor files, and `record_file` naming the model it was trained from (plus `record`)."""
    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in base_dir.iterdir():
        if f.is_file() and not (
            f.suffix == ".safetensors" or f.name in ("config.json", "model.safetensors.index.json")
        ):
            shutil.copy2(f, tmp / f.name)
    model.save_pretrained(str(tmp))
    (tmp / record_file).write_text(
        json.dumps({"trained_from": str(base_dir), "base_fingerprint": base_fingerprint, **(record or {})})
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def seeded_model(config: RunConfig, dtype: str):
    """Seed, thread count, then the base model (built offline first if `model.init_tiny`) and its processor."""
    from vlrl.models.loading import ensure_model, load_policy_model
    from vlrl.models.processor import load_processor
    from vlrl.training.seeding import seed_everything

    seed_everything(config.train.seed)
    if config.runtime.torch_threads:
        torch.set_num_threads(config.runtime.torch_threads)
    model_dir = ensure_model(config.model)
    return model_dir, load_processor(model_dir), load_policy_model(model_dir, dtype=dtype)


def run_sft(
    config: RunConfig,
    out_dir: str | Path,
    progress: Callable[[int, int, float], None] | None = None,
    overwrite: bool = False,
) -> Path:
    """Behaviour-clone the oracle; writes a LoRA adapter (mode lora) or a whole model (mode full).

    `out_dir` must be new or empty unless `overwrite`, and never the base model itself
    (`check_output_dir`, before any training). The output carries its lineage (lineage.json and
    vlrl_lineage.json, and an MLflow run when `tracking.enabled`), so it can be registered and is
    refused on its own training split.
    """
    from vlrl.tracking.lineage import collect_lineage
    from vlrl.tracking.tracker import RunTracker

    noise = config.train.sft.noise
    if noise > 0 and not env_class(config.env.name).gives_random_responses():
        raise VlrlError(
            f"train.sft.noise = {noise} needs env '{config.env.name}' to give random responses "
            "(a random_response(rng) method); set train.sft.noise=0"
        )
    out_dir = check_output_dir(out_dir, config.model.path, overwrite)
    demonstrator = check_demonstrator(config, sft_tasks(config))
    tracker = RunTracker.from_config(config)
    lineage = collect_lineage(config, out_dir, kind="sft", resumed=False, extra={"demonstrator": demonstrator})
    tracker.start(config, out_dir, lineage)
    try:
        out = _train_sft(config, out_dir, progress, demonstrator)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end("FINISHED", out)
    return out


def sft_tasks(config: RunConfig) -> list[Task]:
    """The SFT tasks: the END of the training split, so that GRPO (which starts at its shuffled
    beginning) mostly sees tasks the warm start did not."""
    split = build_split(config.env, "train")
    return [split[len(split) - 1 - i] for i in range(min(config.train.sft.episodes, len(split)))]


def _train_sft(
    config: RunConfig, out_dir: Path, progress: Callable[[int, int, float], None] | None, demonstrator: dict
) -> Path:
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import vision_special_token_ids, worker_device
    from vlrl.models.lora import apply_lora, save_adapter

    s = config.train.sft
    model_dir, processor, model = seeded_model(config, config.model.dtype)
    chat = ChatFormat(processor)
    if s.mode == "lora":
        lo = config.model.lora
        model = apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules, lo.include_vision)
    suppress = vision_special_token_ids(processor)
    pad = chat.pad_id

    device = worker_device(config)
    model.to(device)
    # fp32 weights and optimizer state, bf16 matmuls: the usual mixed precision on a GPU.
    autocast = torch.autocast(
        "cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and config.model.dtype == "float32"
    )

    rng = random.Random(config.train.seed)
    tasks = sft_tasks(config)
    batches = TranscriptBatches(config, chat, tasks, pad, spatial_merge_size(model))

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr)
    total = s.epochs * -(-len(tasks) // s.batch_size)
    model.train()
    history, step = [], 0
    started = time.monotonic()
    budget_s = 60 * s.max_minutes if s.max_minutes is not None else None
    out_of_time = False
    for epoch in range(s.epochs):
        for batch in batches.epoch(epoch, rng, workers=s.data_workers):
            if reached_target(history, s.target_loss):
                break
            elapsed = time.monotonic() - started
            if budget_s is not None and elapsed > budget_s:
                out_of_time = True
                break
            factor = lr_factor(step, s.lr_schedule, s.warmup_steps, total, elapsed / budget_s if budget_s else 0.0)
            for group in opt.param_groups:
                group["lr"] = s.lr * factor
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast:
                loss = sft_loss(model, batch, suppress)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.train.max_grad_norm)
            opt.step()
            step += 1
            history.append(
                {
                    "step": step,
                    "epoch": epoch,
                    "loss": float(loss.detach()),
                    "lr": s.lr * factor,
                    "seconds": round(time.monotonic() - started, 2),
                }
            )
            if progress:
                progress(step, total, float(loss.detach()))
        if out_of_time or reached_target(history, s.target_loss):
            break
    if out_of_time:
        log.warning("SFT stopped at step %d of %d: train.sft.max_minutes (%s) reached", step, total, s.max_minutes)
    model.to("cpu")
    fingerprint = model_fingerprint(model_dir)
    if s.mode == "full":
        out = save_full_model(model, Path(model_dir), out_dir, fingerprint, record={"demonstrator": demonstrator})
    else:
        out = Path(save_adapter(model, out_dir, fingerprint))
    (out / "sft_demonstrator.json").write_text(json.dumps(demonstrator))
    (out / "sft_history.json").write_text(json.dumps(history))
    return out
