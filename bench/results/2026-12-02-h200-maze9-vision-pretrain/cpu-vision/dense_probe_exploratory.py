import sys
import time

import torch

sys.path.insert(0, "/work/main/bench")
sys.path.insert(0, "/tmp/li")
from local_init import init_local_vision_attention
from transformers import Qwen3VLForConditionalGeneration

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env
from vlrl.envs.maze.maze import MOVES
from vlrl.models.processor import load_processor

mdir, size, li, lr, steps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
dev = sys.argv[6] if len(sys.argv) > 6 else "cpu"
torch.manual_seed(0)


def data(split, n):
    config = load_config(
        None,
        ["env.name=maze_look", "env.layout=blocks", f"env.sizes=[{size}]", "env.placement=random", "env.cell_px=16"],
    )
    ims, dense, agent = [], [], []
    for task in list(build_split(config.env, split))[:n]:
        env = make_env(config.env)
        obs = env.reset(task)
        mz = env.maze
        ims.append(obs.images[0])
        lab = []
        for r in range(size):
            for c in range(size):
                free = mz.is_free((r, c))
                lab.append(
                    [float(free)] + [float(free and mz.move((r, c), m) is not None) for m in MOVES] + [float(free)] * 4
                )
        dense.append(lab)
        agent.append(env.pos[0] * size + env.pos[1])
    return ims, torch.tensor(dense), torch.tensor(agent)


ims, lab, ag = data("train", 2048)
hims, hlab, hag = data("holdout", 300)
print(len(ims), len(hims), lab.shape, hlab.shape)
model = Qwen3VLForConditionalGeneration.from_pretrained(mdir, dtype=torch.float32).model.visual
if li:
    init_local_vision_attention(model, 2, li)
head = torch.nn.Linear(model.merger.linear_fc2.out_features, 5)
model.to(dev)
head.to(dev)
proc = load_processor(mdir).image_processor
enc, henc = proc(images=ims, return_tensors="pt"), proc(images=hims, return_tensors="pt")
per = int(enc["image_grid_thw"][0].prod())
pv, grids = enc["pixel_values"].to(dev), enc["image_grid_thw"].to(dev)
lab, hlab = lab.to(dev), hlab.to(dev)


def fwd(p, g):
    return head(model(p, grid_thw=g, return_dict=True).pooler_output)


opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=lr)
t0 = time.time()
for step in range(1, steps + 1):
    idx = torch.randint(0, len(lab), (64,), device=dev)
    out = fwd(pv.view(len(ims), per, -1)[idx].flatten(0, 1), grids[idx]).view(64, -1, 5)
    y = lab[idx]
    mask = torch.cat([torch.ones_like(y[..., :1]), y[..., 5:]], -1)
    loss = (
        torch.nn.functional.binary_cross_entropy_with_logits(out, y[..., :5], reduction="none") * mask
    ).sum() / mask.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0 or step == 1:
        with torch.no_grad():
            ho = (
                torch.cat(
                    [
                        fwd(
                            henc["pixel_values"][i * per * 50 : (i + 1) * per * 50].to(dev),
                            henc["image_grid_thw"][i * 50 : (i + 1) * 50].to(dev),
                        )
                        for i in range((len(hims) + 49) // 50)
                    ]
                ).view(len(hims), -1, 5)
                > 0
            )
        hy = hlab[..., :5].bool()
        free = hlab[..., 0].bool()
        bits = (ho[..., 1:] == hy[..., 1:]).all(-1)[free].float().mean().item()
        agent_exact = (
            (ho[torch.arange(len(hims)), hag.to(dev), 1:] == hy[torch.arange(len(hims)), hag.to(dev), 1:])
            .all(-1)
            .float()
            .mean()
            .item()
        )
        wall = (ho[..., 0] == hy[..., 0]).float().mean().item()
        print(
            step,
            round(loss.item(), 3),
            f"wall={wall:.3f} free-block exact={bits:.3f} agent exact={agent_exact:.3f}",
            round(time.time() - t0),
            flush=True,
        )
