"""Perception pretraining (vlrl.training.vision_pretrain) and the local attention init of tiny.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlrl.envs.maze.maze import MOVES, SQUARE_LABELS
from vlrl.errors import VlrlError
from vlrl.models.fingerprint import model_fingerprint

ROOT = Path(__file__).resolve().parents[2]
BLOCKS_7 = ("env.layout=blocks", "env.sizes=[7]", "env.cell_px=16")  # ci: patch 8 x merge 2 = 16 px per token


def test_square_labels_are_what_each_block_shows(ci_config):
    from vlrl.envs.base import build_split, make_env

    config = ci_config(*BLOCKS_7, "env.name=maze_look", "env.placement=random")
    task = build_split(config.env, "train")[3]
    env = make_env(config.env)
    env.reset(task)
    maze, labels = env.maze, env.maze.square_labels(env.pos)
    assert len(labels) == 49 and all(len(row) == len(SQUARE_LABELS) for row in labels)
    column = {name: i for i, name in enumerate(SQUARE_LABELS)}
    assert [i for i, row in enumerate(labels) if row[column["agent"]]] == [env.pos[0] * 7 + env.pos[1]]
    assert [i for i, row in enumerate(labels) if row[column["goal"]]] == [maze.goal[0] * 7 + maze.goal[1]]
    for i, row in enumerate(labels):
        cell = divmod(i, 7)
        assert row[column["wall"]] == float(not maze.is_free(cell))
        for m in MOVES:
            assert row[column[f"open_{m}"]] == float(maze.is_free(cell) and maze.move(cell, m) is not None)
    # The agent's own square answers the look drill.
    agent_row = labels[env.pos[0] * 7 + env.pos[1]]
    assert [m for m in MOVES if agent_row[column[f"open_{m}"]]] == env.open_moves()


def test_pretrain_vision_trains_the_tower_only_and_writes_a_new_base(ci_config, ci_model_dir, tmp_path):
    from vlrl.training.vision_pretrain import pretrain_vision

    config = ci_config(
        *BLOCKS_7,
        "runtime.torch_threads=2",
        "train.vision_pretrain.steps=40",
        "train.vision_pretrain.tasks=128",
        "train.vision_pretrain.eval_tasks=16",
        "train.vision_pretrain.eval_every=20",
        "train.vision_pretrain.warmup_steps=5",
    )
    out = pretrain_vision(config, tmp_path / "seeing")

    record = json.loads((out / "vlrl_vision_pretrain.json").read_text())
    assert record["base_fingerprint"] == model_fingerprint(ci_model_dir) != model_fingerprint(out)
    assert record["steps"] == 40 and record["final"]["step"] == 40
    history = json.loads((out / "vision_pretrain_history.json").read_text())
    assert [h["step"] for h in history] == [20, 40]
    assert history[-1]["acc/wall"] > 0.9  # walls are the easiest label: a broken loss or head stays near 0.6
    assert history[-1]["loss"] < 0.5

    before, after = load_file(ci_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".visual." in k for k in changed)  # the language model is untouched
    assert any("patch_embed" in k for k in changed) and any("merger" in k for k in changed)
    assert (out / "tokenizer.json").is_file() and (out / "vlrl_tiny.json").is_file()

    from vlrl.models.loading import load_policy_model

    load_policy_model(out)  # a loadable base for SFT and GRPO

    from vlrl.tracking.lineage import model_lineage

    # A run on the new base records where its tower's training came from.
    lineage = model_lineage(ci_config(f"model.path={out}"))
    assert lineage["fingerprint"] == model_fingerprint(out)
    assert lineage["vision_pretrain_record"]["base_fingerprint"] == model_fingerprint(ci_model_dir)
    assert lineage["vision_pretrain_record"]["steps"] == 40 and "sft_record" not in lineage


def test_pretrain_vision_refuses_images_that_are_not_one_token_per_square(ci_config, tmp_path):
    from vlrl.training.vision_pretrain import pretrain_vision

    config = ci_config(
        "env.layout=blocks",
        "env.sizes=[7]",
        "env.cell_px=24",
        "train.vision_pretrain.tasks=8",
        "train.vision_pretrain.eval_tasks=4",
    )
    with pytest.raises(VlrlError, match="one merged image token per maze square.*env.cell_px"):
        pretrain_vision(config, tmp_path / "seeing")
    assert not (tmp_path / "seeing").exists()


def test_pretrain_vision_refuses_an_output_that_holds_files_or_is_the_base(ci_config, ci_model_dir, tmp_path):
    from vlrl.training.vision_pretrain import pretrain_vision

    config = ci_config(*BLOCKS_7, "train.vision_pretrain.tasks=8", "train.vision_pretrain.eval_tasks=4")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(VlrlError, match="already exists and is not empty.*--overwrite"):
        pretrain_vision(config, taken)
    assert (taken / "notes.txt").read_text() == "mine"
    before = model_fingerprint(ci_model_dir)
    with pytest.raises(VlrlError, match="is the base model itself"):
        pretrain_vision(config, ci_model_dir, overwrite=True)
    assert model_fingerprint(ci_model_dir) == before


def test_pretrain_vision_says_so_when_its_budget_allows_no_step(ci_config, ci_model_dir, tmp_path, monkeypatch):
    import types

    from vlrl.training import vision_pretrain
    from vlrl.training.vision_pretrain import pretrain_vision

    # A clock of this module only that moves a minute a reading: the budget (0.5 min) is spent
    # before the first step, whatever the machine's speed; nothing else sees the fake clock.
    ticks = iter(range(0, 10**6, 60))
    monkeypatch.setattr(vision_pretrain, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    config = ci_config(
        *BLOCKS_7,
        "train.vision_pretrain.tasks=8",
        "train.vision_pretrain.eval_tasks=4",
        "train.vision_pretrain.max_minutes=0.5",
    )
    before = model_fingerprint(ci_model_dir)
    with pytest.raises(VlrlError) as raised:
        pretrain_vision(config, tmp_path / "seeing")
    assert str(raised.value) == (
        "train.vision_pretrain.max_minutes ended vision pretraining before its first step; give it more time"
    )
    assert not (tmp_path / "seeing").exists() and not list(tmp_path.glob(".seeing*"))  # no output, no temporary copy
    assert model_fingerprint(ci_model_dir) == before


def test_pretrain_vision_refuses_an_env_without_squares(ci_model_dir, tmp_path):
    from vlrl.config import load_config
    from vlrl.training.vision_pretrain import pretrain_vision

    config = load_config(ROOT / "configs" / "gui-cpu.yaml", [f"model.path={ci_model_dir}", f"storage.root={tmp_path}"])
    with pytest.raises(VlrlError, match="reads maze squares; env 'gui' is not a maze env"):
        pretrain_vision(config, tmp_path / "seeing")


def _attention_argmax_offsets(visual, grid: int) -> list[tuple[int, int]]:
    """For each head of the first block: the commonest (row, column) offset its interior patches attend to most."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen

    torch.manual_seed(0)
    pixels = torch.rand(grid * grid, 3 * 2 * visual.patch_size**2) * 2 - 1
    grid_thw = torch.tensor([[1, grid, grid]])
    probs = []

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        cos, sin = kwargs["position_embeddings"]
        q, k, _ = module.qkv(x).reshape(x.shape[0], 3, module.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = qwen.apply_rotary_pos_emb_vision(q, k, cos, sin)
        probs.append(torch.einsum("nhd,mhd->hnm", q, k).mul(module.scaling).softmax(-1))

    handle = visual.blocks[0].attn.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        visual(pixels, grid_thw=grid_thw)
    handle.remove()
    # Patches come in merge x merge groups (the processor's order): rebuild each one's (row, column).
    m, g = visual.spatial_merge_size, grid
    rows = torch.arange(g).view(g // m, m, 1, 1).expand(g // m, m, g // m, m).permute(0, 2, 1, 3).flatten()
    cols = torch.arange(g).view(1, 1, g // m, m).expand(g // m, m, g // m, m).permute(0, 2, 1, 3).flatten()
    inner = [i for i in range(g * g) if 3 <= rows[i] < g - 3 and 3 <= cols[i] < g - 3]
    offsets = []
    for head in probs[0]:
        best = head[inner].argmax(-1)
        pairs = list(zip((rows[best] - rows[inner]).tolist(), (cols[best] - cols[inner]).tolist()))
        offsets.append(max(set(pairs), key=pairs.count))
    return offsets


def test_local_attention_init_points_each_head_at_one_neighbouring_square():
    from transformers import Qwen3VLForConditionalGeneration

    from vlrl.models.tiny import TINY_SPECS, _init_local_vision_attention, build_tokenizer, tiny_config

    spec = TINY_SPECS["ci"]
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(tiny_config(spec, build_tokenizer(spec.tokenizer_vocab)))
    visual = model.model.visual
    assert _attention_argmax_offsets(visual, 14) != [(-2, 0), (2, 0), (0, -2), (0, 2)]  # random: no such pattern
    _init_local_vision_attention(visual, spec.spatial_merge, 96.0)
    assert _attention_argmax_offsets(visual, 14) == [(-2, 0), (2, 0), (0, -2), (0, 2)]  # up, down, left, right


def test_only_the_maze9_preset_starts_local():
    from vlrl.models.tiny import TINY_SPECS

    # ci and demo keep their first weights (and fingerprints); maze9 was rebuilt with local heads.
    assert {name for name, spec in TINY_SPECS.items() if spec.vision_local_attention} == {"maze9"}
