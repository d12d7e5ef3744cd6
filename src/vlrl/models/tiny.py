"""Tiny, randomly initialised Qwen3-VL models, built fully offline.

A tiny model has the real Qwen3-VL architecture (vision tower with deepstack, M-RoPE, the chat
format and special tokens of Qwen) at a size that trains on two CPU cores. It comes with its own
small byte-level BPE tokenizer, trained in memory on a built-in corpus of chat and maze-game
text, so nothing is ever downloaded. The directory it writes loads with
`AutoModelForImageTextToText.from_pretrained`, `load_processor` and vLLM like any Qwen3-VL
checkpoint.

Presets (`TINY_SPECS`): "ci" (< 1M parameters, for tests), "demo" (a few million, able to
learn a small visual maze), "maze9" (~56M, the GPU recipe for 9x9 block mazes), "qwen3vl-2b-shape" (the layer shapes of
Qwen3-VL-2B, ~1.8B
parameters in bfloat16) and "qwen3vl-8b-shape" (every shape of Qwen3-VL-8B, 8.77B parameters),
for GPU throughput and memory runs. Every preset uses our small tokenizer. The 2B shape keeps
its ~1k-token vocabulary, so its embedding and LM head are tiny (~2M instead of ~311M
parameters). The 8B shape pads the model's vocabulary to Qwen's real 151,936 (`model_vocab`):
the tokenizer only ever produces the first ~1k ids, but the embedding, the LM head, the logits
and the sampler have the real sizes, so its compute and memory are those of the real
checkpoint. Neither is a drop-in for real weights.
The same preset and seed always give byte-identical weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vlrl.config import TinyPreset
from vlrl.errors import VlrlError
from vlrl.models.output import check_output_dir

TinySize = TinyPreset  # the preset names live in vlrl.config, which validates model.init_tiny


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny Qwen3-VL model and its image processor."""

    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    head_dim: int  # vLLM's CPU attention needs 32, 64, 80, 96, ...
    text_intermediate: int
    vision_depth: int
    vision_hidden: int
    vision_heads: int
    vision_intermediate: int
    patch_size: int
    spatial_merge: int
    image_min_pixels: int  # below this an image is upscaled
    image_max_pixels: int  # above this an image is downscaled
    tokenizer_vocab: int  # BPE vocabulary before the special/added tokens
    # The defaults below keep the small presets' config.json (and fingerprints) as first released.
    deepstack_indexes: tuple[int, ...] = (0,)  # vision layers whose features feed the LM's first layers
    mrope_section: tuple[int, int, int] | None = None  # None: derived from head_dim (_mrope_section)
    vision_position_embeddings: int = 256  # a perfect square: the learned position grid (16x16)
    dtype: str = "float32"  # dtype of the saved weights
    # Rows of the embedding and LM head when larger than the tokenizer (None: the tokenizer's size).
    # Ids past the tokenizer decode to nothing; a random model still samples them.
    model_vocab: int | None = None
    # > 0: each vision attention head starts out attending to one neighbouring square (up, down,
    # left, right: spatial_merge patches away), with this strength (see _init_local_vision_attention).
    vision_local_attention: float = 0.0


TINY_SPECS: dict[str, TinySpec] = {
    # ~0.9M parameters: fast enough for unit tests.
    "ci": TinySpec(
        text_hidden=128,
        text_layers=2,
        text_heads=4,
        text_kv_heads=2,
        head_dim=32,
        text_intermediate=256,
        vision_depth=2,
        vision_hidden=64,
        vision_heads=4,
        vision_intermediate=256,
        patch_size=8,
        spatial_merge=2,
        image_min_pixels=16 * 16,
        image_max_pixels=224 * 224,
        tokenizer_vocab=1024,
    ),
    # ~5M parameters: still well under a second per 16x150-token training batch on 2 cores.
    "demo": TinySpec(
        text_hidden=256,
        text_layers=4,
        text_heads=8,
        text_kv_heads=2,
        head_dim=32,
        text_intermediate=768,
        vision_depth=2,
        vision_hidden=128,
        vision_heads=4,
        vision_intermediate=512,
        patch_size=8,
        spatial_merge=2,
        image_min_pixels=16 * 16,
        image_max_pixels=224 * 224,
        tokenizer_vocab=1024,
    ),
    # ~56M parameters, for the GPU recipe of the reference task (configs/gpu-maze9.yaml): 9x9 block
    # mazes at 16 px per block are 144 px = 9x9 merged tokens, one per block. Seeing a block (wall,
    # floor, agent, goal) is local and cheap, so the vision tower stays small (4 x 256 over the
    # 18x18 patches); finding the way to the goal is a computation over the whole maze, so the
    # depth goes to the language model (12 x 512, deepstack feeding its first layers). Its heads
    # start local (vision_local_attention): from a plain random start the tower never learnt which
    # blocks touch the agent (bench/RESULTS.md), so the weights differ from the first maze9's.
    "maze9": TinySpec(
        text_hidden=512,
        text_layers=12,
        text_heads=8,
        text_kv_heads=4,
        head_dim=64,
        text_intermediate=2048,
        vision_depth=4,
        vision_hidden=256,
        vision_heads=4,
        vision_intermediate=1024,
        patch_size=8,
        spatial_merge=2,
        image_min_pixels=16 * 16,
        image_max_pixels=224 * 224,
        tokenizer_vocab=1024,
        deepstack_indexes=(1, 3),
        vision_local_attention=48.0,
    ),
    # Qwen3-VL-2B's layer shapes (~1.7B parameters) with our ~1k-token tokenizer, so the embedding
    # and LM head are small. Random weights: for GPU memory and throughput runs, not for learning.
    # Images of 32 px to 448 px per side keep a 225 px maze at 224 px = 7x7 merged tokens.
    "qwen3vl-2b-shape": TinySpec(
        text_hidden=2048,
        text_layers=28,
        text_heads=16,
        text_kv_heads=8,
        head_dim=128,
        text_intermediate=6144,
        vision_depth=24,
        vision_hidden=1024,
        vision_heads=16,
        vision_intermediate=4096,
        patch_size=16,
        spatial_merge=2,
        image_min_pixels=32 * 32,
        image_max_pixels=448 * 448,
        tokenizer_vocab=1024,
        deepstack_indexes=(5, 11, 17),
        mrope_section=(24, 20, 20),
        vision_position_embeddings=2304,
        dtype="bfloat16",
    ),
    # Qwen3-VL-8B's shapes (transformers' Qwen3VLVisionConfig defaults are this vision tower):
    # text 4096 x 36 layers, 32 heads / 8 KV heads, head_dim 128, MLP 12288, vocabulary 151,936;
    # vision 27 x 1152, 16 heads, MLP 4304, deepstack [8, 16, 24]. 8.77B parameters in bfloat16.
    "qwen3vl-8b-shape": TinySpec(
        text_hidden=4096,
        text_layers=36,
        text_heads=32,
        text_kv_heads=8,
        head_dim=128,
        text_intermediate=12288,
        vision_depth=27,
        vision_hidden=1152,
        vision_heads=16,
        vision_intermediate=4304,
        patch_size=16,
        spatial_merge=2,
        image_min_pixels=32 * 32,
        image_max_pixels=448 * 448,
        tokenizer_vocab=1024,
        deepstack_indexes=(8, 16, 24),
        mrope_section=(24, 20, 20),
        vision_position_embeddings=2304,
        dtype="bfloat16",
        model_vocab=151_936,
    ),
}

# Special tokens of the Qwen chat/vision format. Real Qwen3-VL spells them the same way.
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD]
# Answer tags are ordinary (non-special) added tokens: one token each, kept when decoding with
# skip_special_tokens=True, so "<action>right</action>" is three tokens.
ANSWER_TAGS = ["<action>", "</action>", "<answer>", "</answer>"]

# Qwen's chat format: `<|im_start|>role\n...<|im_end|>\n`, images and videos inline where they
# appear in a message's content list. No default system prompt (as in Qwen3-VL-Instruct).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}{%- elif 'text' in part -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- '<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Qwen2/Qwen3's pre-tokenisation split (letters, single digits, punctuation runs, whitespace).
_QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_ACTIONS = ["up", "down", "left", "right", "stop"]
_INSTRUCTIONS = [
    "You are the blue circle. Move to the red square.",
    "You are the blue circle in a maze. Reach the red square, then stop.",
    "The maze has gray walls and a white floor. You can move up, down, left or right, one cell at a time.",
    "Answer with one action inside <action></action> tags, for example <action>up</action>.",
    "Choose one of: up, down, left, right, stop. Put your answer in <answer></answer> tags.",
    "Look at the image and decide where to go next.",
    "Think step by step about the path, then give your action.",
    "Stop only when you are on the target.",
    "What is the next move?",
    "Describe the image.",
    "You are a helpful assistant.",
]
_FEEDBACK = [
    "Cannot move into a wall.",
    "You moved {action}.",
    "You reached the target. Well done!",
    "You stopped, but you are not on the target.",
    "Invalid action. Use one of: up, down, left, right, stop.",
    "The episode is over.",
    "Turn {turn} of 18.",
    "The target is {action} of you.",
]
_REASONING = [
    "The red square is to the {action}, so I will move {action}.",
    "There is a wall above me, so I cannot go up.",
    "I am at row {turn}, column {col}. The target is at row 8, column 8.",
    "I should go {action} first and then down.",
    "I am on the target, so I stop.",
]
_GENERAL_TEXT = """
The quick brown fox jumps over the lazy dog. A picture shows a small grid with colored shapes.
This is a simple game: the player is a circle and the goal is a square. Each step costs nothing,
but the game ends after a fixed number of turns. Please read the question carefully and answer it.
Here is the answer. I think the correct answer is yes. No, that is not right. It is not possible.
The first, second and third rows are empty; the fourth row has a wall in the middle of it.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 18 25 100. Reward: 1.0, score 0.5, success rate 42%.
Position (3, 4) -> (3, 5). Path: right, right, down, down, left. Total: 5 moves.
Hello! How can I help you today? Sure, here is what I see in the image: a blue circle, a red square,
gray walls and white cells. The circle is in the top left corner and the square is in the bottom right.
Describe the image in detail. What do you see? Count the objects and tell me their colors and positions.
There are three people standing near a red car on the street. The sky is blue and the weather is nice.
Could you explain why this happens? Because the model learns from rewards, it improves over time.
We trained the policy for ten steps and evaluated it on new puzzles; it solved most of them quickly.
Instructions: read the text, look at the picture, then write a short and clear response below.
Question: Which way should the agent go? Options: (A) up (B) down (C) left (D) right. Answer: (D)
The door is open, the key is on the table, and the green light means you may go forward now.
If you are unsure, say so. Do not guess. Check your work before you give the final answer.
Morning, afternoon, evening and night; Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.
Some words: water, house, water bottle, chair, window, garden, number, letter, shape, triangle, line.
Large and small, fast and slow, inside and outside, before and after, always and never, more and less.
"""


def _tokenizer_corpus() -> list[str]:
    """A fixed, varied corpus: enough to learn useful merges, identical on every machine."""
    lines: list[str] = [line.strip() for line in _GENERAL_TEXT.strip().splitlines()]
    lines += _INSTRUCTIONS
    for turn in range(1, 19):
        for i, action in enumerate(_ACTIONS):
            fills = {"action": action, "turn": turn, "col": (turn + i) % 9}
            lines += [t.format(**fills) for t in _FEEDBACK + _REASONING]
            # Action words as they appear right after an added tag (no leading space) and in prose.
            lines.append(f"{action}\n {action} {action.capitalize()}")
            # The text of a chat turn, without the special tokens (those are added tokens).
            lines.append(f"user\n{_INSTRUCTIONS[turn % len(_INSTRUCTIONS)]}\n{_FEEDBACK[i]}\nassistant\n{action}\n")
    return lines


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a small byte-level BPE tokenizer in memory and wrap it with Qwen's special tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte stays encodable
        show_progress=False,
    )
    bpe.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in ANSWER_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        extra_special_tokens={
            "image_token": IMAGE_PAD,
            "video_token": VIDEO_PAD,
            "vision_start_token": VISION_START,
            "vision_end_token": VISION_END,
        },
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def _mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen3-VL's [24, 20, 20]."""
    half = head_dim // 2
    spatial = half * 5 // 16
    return [half - 2 * spatial, spatial, spatial]


def tiny_config(spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> Qwen3VLConfig:
    """The Qwen3VLConfig of a tiny model whose special-token ids come from `tokenizer`."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return Qwen3VLConfig(
        text_config={
            "vocab_size": max(len(tokenizer), spec.model_vocab or 0),
            "hidden_size": spec.text_hidden,
            "intermediate_size": spec.text_intermediate,
            "num_hidden_layers": spec.text_layers,
            "num_attention_heads": spec.text_heads,
            "num_key_value_heads": spec.text_kv_heads,
            "head_dim": spec.head_dim,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_interleaved": True,
                "mrope_section": list(spec.mrope_section or _mrope_section(spec.head_dim)),
            },
            "pad_token_id": ids[PAD_TOKEN],
        },
        vision_config={
            "depth": spec.vision_depth,
            "hidden_size": spec.vision_hidden,
            "intermediate_size": spec.vision_intermediate,
            "num_heads": spec.vision_heads,
            "patch_size": spec.patch_size,
            "spatial_merge_size": spec.spatial_merge,
            "temporal_patch_size": 2,
            "out_hidden_size": spec.text_hidden,
            "num_position_embeddings": spec.vision_position_embeddings,  # a perfect square (interpolated)
            "deepstack_visual_indexes": list(spec.deepstack_indexes),
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
    )


def _init_local_vision_attention(visual: torch.nn.Module, offset: int, strength: float) -> None:
    """Start every vision attention head looking at one neighbouring square, like a convolution.

    A random vision tower trained from scratch did not learn which squares touch the agent in
    2,000 steps, while a 3-layer CNN learnt it in under 1,000 (bench/RESULTS.md). This gives the
    tower a CNN's locality without changing its architecture (as ConViT's convolutional
    initialisation does for ViTs). Only the query and key biases change: with the weights' part
    small, head h's query is the constant q_h and its key the constant k. Under the tower's 2-D
    rotary embedding (frequencies w_f on each axis) their score for a key `delta` patches away is
    `sum_f strength * cos(w_f * (delta - d_h))`. That peaks at d_h, one of up/down/left/right
    `offset` patches (one merged square). Heads cycle through the four directions, in every
    layer. Strength 48 puts about 80% of a 64-dim head's attention on its square at init. Training
    is free to move the heads anywhere.
    """
    inv_freq = visual.rotary_pos_emb.inv_freq.float()  # the same frequencies for rows and columns
    directions = [(-offset, 0), (offset, 0), (0, -offset), (0, offset)]
    amp = strength**0.5
    for block in visual.blocks:
        attn = block.attn
        # Rotated pairs are (d, d + head_dim/2): d < F rotates with the row, F <= d < 2F with the column.
        if attn.head_dim != 4 * inv_freq.numel():
            raise VlrlError(f"local vision attention expects head_dim 4 x {inv_freq.numel()}, got {attn.head_dim}")
        bias = attn.qkv.bias.data.view(3, attn.num_heads, attn.head_dim)
        for h in range(attn.num_heads):
            rows, cols = directions[h % 4]
            angle = torch.cat([inv_freq * rows, inv_freq * cols])
            bias[0, h] = amp * torch.cat([angle.cos(), angle.sin()])
            bias[1, h] = torch.cat([torch.full_like(angle, amp), torch.zeros_like(angle)])


def tiny_image_processor(spec: TinySpec) -> Qwen2VLImageProcessorPil:
    """Image processor for `spec`; sizes are pixel counts, sides are rounded to patch*merge."""
    return Qwen2VLImageProcessorPil(
        size={"shortest_edge": spec.image_min_pixels, "longest_edge": spec.image_max_pixels},
        patch_size=spec.patch_size,
        temporal_patch_size=2,
        merge_size=spec.spatial_merge,
        image_mean=[0.5, 0.5, 0.5],  # Qwen3-VL's normalisation
        image_std=[0.5, 0.5, 0.5],
    )


_SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _save_processor_files(out: Path, spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> None:
    """Write tokenizer, image/video processor configs and chat template in the layout of a real
    Qwen3-VL release, naming the stock `Qwen3VLProcessor` so vLLM and AutoProcessor (where
    torchvision exists) load them; vlrl itself uses `load_processor`."""
    tokenizer.save_pretrained(str(out))
    tok_cfg_file = out / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_file.read_text(encoding="utf-8"))
    tok_cfg["model_max_length"] = 4096
    tok_cfg["processor_class"] = "Qwen3VLProcessor"
    _write_json(tok_cfg_file, tok_cfg)

    image_cfg = tiny_image_processor(spec).to_dict()
    image_cfg["image_processor_type"] = "Qwen2VLImageProcessor"
    image_cfg["processor_class"] = "Qwen3VLProcessor"
    _write_json(out / "preprocessor_config.json", image_cfg)
    video_keys = (
        "do_convert_rgb",
        "do_normalize",
        "do_rescale",
        "do_resize",
        "image_mean",
        "image_std",
        "merge_size",
        "patch_size",
        "resample",
        "rescale_factor",
        "size",
        "temporal_patch_size",
    )
    video_cfg = {k: image_cfg[k] for k in video_keys}
    video_cfg.update(video_processor_type="Qwen3VLVideoProcessor", processor_class="Qwen3VLProcessor")
    _write_json(out / "video_preprocessor_config.json", video_cfg)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def build_tiny_model(
    out_dir: str | Path, size: TinySize = "ci", seed: int = 0, overwrite: bool = False, dtype: str | None = None
) -> Path:
    """Build a random Qwen3-VL model of preset `size` (safetensors + processor files) in `out_dir`.

    Weights are saved in `dtype` (default: the preset's, float32 for ci/demo, bfloat16 for the 2B
    and 8B shapes); they are always initialised in float32, so only the final cast differs.
    Deterministic: the same `size`, `seed` and `dtype` give identical weight files (and fingerprint).
    Writes `vlrl_tiny.json` with the preset and seed. Returns the directory.
    """
    if size not in TINY_SPECS:
        raise VlrlError(f"unknown tiny model size {size!r}; choose one of: {', '.join(TINY_SPECS)}")
    spec = TINY_SPECS[size]
    dtype = dtype or spec.dtype
    if dtype not in _SAVE_DTYPES:
        raise VlrlError(f"unknown dtype {dtype!r} for the tiny model; choose one of: {', '.join(_SAVE_DTYPES)}")
    out = check_output_dir(out_dir, overwrite=overwrite)
    if out.exists():
        shutil.rmtree(out)

    tokenizer = build_tokenizer(spec.tokenizer_vocab)
    config = tiny_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config).to(torch.float32)
        if spec.vision_local_attention:
            _init_local_vision_attention(model.model.visual, spec.spatial_merge, spec.vision_local_attention)
    model = model.to(_SAVE_DTYPES[dtype])
    pad_id = tokenizer.pad_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[tokenizer.eos_token_id, pad_id], pad_token_id=pad_id
    )

    # Write next to the target and rename, so a crash never leaves a half-built model behind.
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    _save_processor_files(tmp, spec, tokenizer)
    _write_json(tmp / "vlrl_tiny.json", {"size": size, "seed": seed, "dtype": dtype, "spec": dataclasses.asdict(spec)})
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out
