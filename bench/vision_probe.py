"""Can a tiny Qwen3-VL vision tower, alone, learn which moves are open around the agent?

The maze_look drill without the language model: the vision tower of a tiny model (random
weights), its merged tokens summed, one linear layer to four logits (up/down/left/right open),
binary cross-entropy on block mazes with the agent anywhere; exact-set accuracy on holdout mazes
every `--every` steps. A small CNN (three 3x3 convolutions over the 8x8-patch grid) is the
reference: it learns the look within a few hundred steps where the tiny vision towers stay at
chance, also with their heads started local (`--local-init 48`): one answer per image is too weak a
signal for these towers; dense labels on every square (`vlrl model pretrain-vision`) are what taught
them (bench/results/2026-12-02-h200-maze9-look-drill/).

    python bench/vision_probe.py --model-dir runs/models/maze9 --size 9 --steps 2000 --lr 1e-3 --device cuda \
        --out probe.json
    python bench/vision_probe.py --cnn --size 7 --steps 600 --out cnn.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from vlrl.config import load_config
from vlrl.training.vision_pretrain import _OPEN, perception_examples


def look_data(size: int, split: str, n: int, cell_px: int):
    """Images of `n` maze_look tasks and their labels [n, 4]: 1 where the move is open (the agent's square_labels)."""
    config = load_config(None, ["env.layout=blocks", f"env.sizes=[{size}]", f"env.cell_px={cell_px}"])
    images, squares, agents = perception_examples(config.env, split, n)
    return images, squares[torch.arange(len(agents)), agents][:, _OPEN]


class VisionProbe(torch.nn.Module):
    """The vision tower, its merged tokens summed, a linear layer to 4 logits."""

    def __init__(self, model_dir: str):
        super().__init__()
        from transformers import Qwen3VLForConditionalGeneration

        self.visual = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).model.visual
        self.head = torch.nn.Linear(self.visual.merger.linear_fc2.out_features, 4)

    def forward(self, pixels, grids):
        tokens = self.visual(pixels, grid_thw=grids, return_dict=True).pooler_output
        per = (grids.prod(-1) // self.visual.spatial_merge_size**2).tolist()
        return self.head(torch.stack([t.sum(0) for t in torch.split(tokens, per)]))


class CnnProbe(torch.nn.Module):
    """Reference: an 8x8-patch convolution, three 3x3 convolutions, summed, a linear layer."""

    def __init__(self):
        super().__init__()
        act = torch.nn.GELU
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 8, stride=8),
            act(),
            torch.nn.Conv2d(32, 64, 3, padding=1),
            act(),
            torch.nn.Conv2d(64, 64, 3, padding=1),
            act(),
            torch.nn.Conv2d(64, 64, 3, padding=1),
            act(),
        )
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.net(x).sum((2, 3)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model-dir", help="a tiny model (vlrl model build-tiny); its vision tower is trained from its weights"
    )
    ap.add_argument("--cnn", action="store_true", help="train the CNN reference instead")
    ap.add_argument("--size", type=int, default=9)
    ap.add_argument("--cell-px", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--train", type=int, default=4096, help="training mazes")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--local-init",
        type=float,
        default=0.0,
        help="first start the tower's heads local with this strength (vlrl.models.tiny._init_local_vision_attention)",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    images, labels = look_data(args.size, "train", args.train, args.cell_px)
    h_images, h_labels = look_data(args.size, "holdout", 500, args.cell_px)
    dev = torch.device(args.device)
    if args.cnn:
        model = CnnProbe().to(dev)

        def to_x(ims):
            return torch.tensor(np.stack([np.asarray(i, np.float32) / 127.5 - 1 for i in ims])).permute(0, 3, 1, 2)

        x, hx = to_x(images).to(dev), to_x(h_images).to(dev)
        run = lambda idx: model(x[idx])  # noqa: E731
        run_holdout = lambda: model(hx)  # noqa: E731
    else:
        from vlrl.models.processor import load_processor

        model = VisionProbe(args.model_dir)
        if args.local_init:
            from vlrl.models.tiny import _init_local_vision_attention

            _init_local_vision_attention(model.visual, model.visual.spatial_merge_size, args.local_init)
        model = model.to(dev)
        proc = load_processor(args.model_dir).image_processor
        enc, h_enc = proc(images=images, return_tensors="pt"), proc(images=h_images, return_tensors="pt")
        per = int(enc["image_grid_thw"][0].prod())  # every maze image has the same size
        pv, grids = enc["pixel_values"].to(dev), enc["image_grid_thw"].to(dev)
        run = lambda idx: model(pv.view(len(images), per, -1)[idx].flatten(0, 1), grids[idx])  # noqa: E731
        run_holdout = lambda: model(h_enc["pixel_values"].to(dev), h_enc["image_grid_thw"].to(dev))  # noqa: E731
    labels, h_labels = labels.to(dev), h_labels.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    curve, t0 = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, len(labels), (args.batch,), device=dev)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(run(idx), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.every == 0 or step == args.steps:
            with torch.no_grad():
                pred = run_holdout() > 0
            exact = (pred == h_labels.bool()).all(1).float().mean().item()
            curve.append(
                {
                    "step": step,
                    "loss": round(loss.item(), 4),
                    "holdout_exact": round(exact, 4),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(json.dumps(curve[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "curve": curve}, f, indent=1)


if __name__ == "__main__":
    main()
