"""Perception pretraining of a tiny model's vision tower: dense labels on every maze square.

Why this stage exists: a tiny Qwen3-VL trained from random weights on the walk (SFT on oracle
transcripts, one action per turn) never learnt which blocks touch the agent on 9x9 block mazes.
Its first move depended on the start corner only, and a look drill on the whole model stayed at
the blind score too (bench/results/2026-12-02-h200-maze9-look-drill/). One answer per image
is too weak a signal for a random vision tower. Here every merged image token gets its own targets
(`Maze.square_labels`): is its square a wall, the agent, the goal, and which of its four moves are
open. So a 9x9 image gives 81 supervised examples of purely local perception instead of one. No
path, distance or action is taught: planning is left to SFT and GRPO. A real checkpoint's vision
tower is pretrained already, and this is the tiny model's stand-in for that.

What it does, top to bottom:
- It renders `tasks` train-split mazes with the agent anywhere (the `maze_look` placement, so
  holdout wall layouts are never seen).
- It trains the vision tower (patch embedding, blocks, mergers) in full, with a linear head from
  each merged token to its square's labels. The language model is untouched, and the head is
  thrown away.
- Every `eval_every` steps it measures on holdout images. It reports three scores: per-label
  accuracy; the share of free squares whose four move labels are all right; and the share of
  images whose agent square is read exactly (the look task answered from one token).
- It writes a whole model directory (a new base, so a new fingerprint). Its
  `vlrl_vision_pretrain.json` names the model it came from and the scores.

It needs one merged token per maze square: `env.cell_px` = patch size x spatial merge (16 for the
tiny presets), and a maze env (`maze` or one of its relatives).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from vlrl.config import RunConfig
from vlrl.envs.base import build_split, make_env
from vlrl.envs.maze.config import MazeEnvConfig
from vlrl.envs.maze.maze import SQUARE_LABELS
from vlrl.errors import VlrlError
from vlrl.models.output import check_output_dir
from vlrl.training.sft import save_full_model, seeded_model

log = logging.getLogger(__name__)
_OPEN = slice(SQUARE_LABELS.index("open_up"), len(SQUARE_LABELS))  # the four move labels, last in SQUARE_LABELS


def perception_examples(env: MazeEnvConfig, split: str, n: int) -> tuple[list, torch.Tensor, torch.Tensor]:
    """`n` images of `split` with the agent anywhere, their square labels [n, squares, L] and agent squares [n]."""
    look = env.model_copy(update={"name": "maze_look", "placement": "random", "max_turns": 1})
    tasks = build_split(look, split)
    images, labels, agents = [], [], []
    for i in range(min(n, len(tasks))):
        episode = make_env(look)
        obs = episode.reset(tasks[i])
        images.append(obs.images[0])
        labels.append(episode.maze.square_labels(episode.pos))
        agents.append(episode.pos[0] * episode.maze.size + episode.pos[1])
    if not images:
        raise VlrlError(f"the {split} split of env {env.name} has no tasks; vision pretraining needs some")
    return images, torch.tensor(labels), torch.tensor(agents)


def perception_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy per square and label; a wall's move labels do not count (always 0)."""
    weight = torch.ones_like(labels)
    weight[..., _OPEN] = (1 - labels[..., :1]).expand_as(labels[..., _OPEN])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return (loss * weight).sum() / weight.sum()


def perception_scores(logits: torch.Tensor, labels: torch.Tensor, agents: torch.Tensor) -> dict[str, float]:
    """Per-label accuracy, free squares with all four moves right, and agent squares read exactly."""
    pred, truth = logits > 0, labels > 0.5
    free = ~truth[..., 0]
    moves_right = (pred[..., _OPEN] == truth[..., _OPEN]).all(-1)
    rows = torch.arange(len(agents), device=agents.device)
    right = pred == truth
    # A move label counts on free squares only (on a wall it is always 0, and not trained).
    scores = {
        f"acc/{name}": (right[..., i] if i < _OPEN.start else right[..., i][free]).float().mean().item()
        for i, name in enumerate(SQUARE_LABELS)
    }
    scores["free_squares_exact"] = moves_right[free].float().mean().item()
    scores["agent_exact"] = moves_right[rows, agents].float().mean().item()
    return scores


class _Images:
    """Processed images on the device, with one merged token per maze square checked."""

    def __init__(self, processor, images: list, squares: int, merge: int, device: torch.device):
        enc = processor.image_processor(images=images, return_tensors="pt")
        grid = enc["image_grid_thw"]
        patches = int(grid[0].prod())  # per image; all maze images of one size have the same grid
        if (grid != grid[0]).any() or patches // merge**2 != squares:
            raise VlrlError(
                f"vision pretraining needs one merged image token per maze square; the images give "
                f"{patches // merge**2} tokens for {squares} squares: set env.cell_px to the model's patch size x "
                "spatial merge"
            )
        pixels = enc["pixel_values"].to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
        self.pixels = pixels.view(len(images), patches, -1)
        self.grid = grid.to(device)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pixels[idx].flatten(0, 1), self.grid[idx]


def pretrain_vision(config: RunConfig, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Train the vision tower of `config.model` on square labels (see the module docstring); write a new base.

    `out_dir` must be new or empty unless `overwrite`, and never the base itself: that is checked
    before any training (`vlrl.models.output.check_output_dir`, shared with SFT), so a wrong path costs nothing and
    replaces nothing.
    """
    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import worker_device

    if not isinstance(config.env, MazeEnvConfig):
        raise VlrlError(f"vision pretraining reads maze squares; env {config.env.name!r} is not a maze env")
    out_dir = check_output_dir(out_dir, config.model.path, overwrite)
    s = config.train.vision_pretrain
    model_dir, processor, model = seeded_model(config, "float32")
    visual = model.model.visual
    merge = visual.spatial_merge_size
    device = worker_device(config)

    t0 = time.monotonic()
    images, labels, _ = perception_examples(config.env, "train", s.tasks)
    h_images, h_labels, h_agents = perception_examples(config.env, "holdout", s.eval_tasks)
    squares = labels.shape[1]
    train, holdout = (
        _Images(processor, images, squares, merge, device),
        _Images(processor, h_images, squares, merge, device),
    )
    labels, h_labels, h_agents = labels.to(device), h_labels.to(device), h_agents.to(device)
    log.info(
        "vision pretraining: %d train and %d holdout images in %.1f s",
        len(images),
        len(h_images),
        time.monotonic() - t0,
    )

    head = torch.nn.Linear(visual.merger.linear_fc2.out_features, len(SQUARE_LABELS))
    visual.to(device).train()
    head.to(device)
    params = list(visual.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")

    def logits_of(pixels, grid) -> torch.Tensor:
        with autocast:
            tokens = visual(pixels, grid_thw=grid, return_dict=True).pooler_output
            return head(tokens).float().view(len(grid), squares, -1)

    def measure(step: int, loss: torch.Tensor) -> dict:
        visual.eval()
        with torch.no_grad():
            chunks = [
                logits_of(*holdout.batch(idx)) for idx in torch.arange(len(h_labels), device=device).split(s.batch_size)
            ]
        visual.train()
        scores = perception_scores(torch.cat(chunks), h_labels, h_agents)
        row = {"step": step, "loss": round(float(loss.detach()), 5), "seconds": round(time.monotonic() - started, 1)}
        row.update({k: round(v, 4) for k, v in scores.items()})
        log.info("vision pretraining %s", json.dumps(row))
        return row

    history, started, step = [], time.monotonic(), 0
    budget_s = 60 * s.max_minutes if s.max_minutes is not None else None
    while step < s.steps and (budget_s is None or time.monotonic() - started < budget_s):
        for group in opt.param_groups:
            group["lr"] = s.lr * min(1.0, (step + 1) / max(1, s.warmup_steps))
        idx = torch.randint(0, len(labels), (s.batch_size,), device=device)
        loss = perception_loss(logits_of(*train.batch(idx)), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.train.max_grad_norm)
        opt.step()
        step += 1
        if step % s.eval_every == 0 or step == s.steps:
            history.append(measure(step, loss))
    if step == 0:
        raise VlrlError(
            "train.vision_pretrain.max_minutes ended vision pretraining before its first step; give it more time"
        )
    if not history or history[-1]["step"] != step:
        history.append(measure(step, loss))  # the budget ended it between two measurements
    if step < s.steps:
        log.warning(
            "vision pretraining stopped at step %d of %d: train.vision_pretrain.max_minutes (%s) reached",
            step,
            s.steps,
            s.max_minutes,
        )

    visual.to("cpu")
    model.to(_saved_dtype(model_dir))  # a float32 base stays float32, a bfloat16 one bfloat16
    base_fingerprint = model_fingerprint(model_dir)
    record = {
        "steps": step,
        "settings": s.model_dump(),
        "final": history[-1],
        "env": {"sizes": config.env.sizes, "layout": config.env.layout, "cell_px": config.env.cell_px},
    }
    out = save_full_model(model, model_dir, out_dir, base_fingerprint, "vlrl_vision_pretrain.json", record)
    (out / "vision_pretrain_history.json").write_text(json.dumps(history))
    return out


def _saved_dtype(model_dir: Path) -> torch.dtype:
    """The dtype the base's weights were saved in (config.json; float32 when it does not say)."""
    from vlrl.models.loading import read_model_config

    config = read_model_config(model_dir)
    name = config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32
