"""The Qwen-VL processor vlrl uses: tokenizer + image processor, no video and no torchvision.

transformers' `Qwen3VLProcessor` insists on a video processor, and the video processor needs
torchvision, which has no CPU build for our torch. `ProcessorMixin` derives a processor's parts
from its `__init__` signature, so a subclass whose `__init__` simply has no `video_processor`
parameter is a complete image+text processor. Everything else (image-token expansion,
`mm_token_type_ids`, chat templates) is inherited unchanged.

`load_processor` builds one from a local model directory: our tiny models and real Qwen3-VL
(or Qwen2.5-VL, whose image handling is the same) checkpoints alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, Qwen3VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vlrl.errors import VlrlError


class VlrlQwenVLProcessor(Qwen3VLProcessor):
    """`Qwen3VLProcessor` without a video processor (so without torchvision).

    Calling it returns `input_ids`, `attention_mask`, `mm_token_type_ids` and, with images,
    `pixel_values` and `image_grid_thw`: pass all of them to the model's forward/generate.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # No `video_processor` parameter on purpose: see the module docstring.
        super().__init__(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **kwargs)


def _read_chat_template(model_dir: Path, tokenizer) -> str | None:
    """The chat template, from whichever place a checkpoint keeps it (newest convention first)."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = model_dir / "chat_template.json"  # older Qwen-VL releases
    if json_file.is_file():
        template = json.loads(json_file.read_text(encoding="utf-8")).get("chat_template")
        if template:
            return template
    return getattr(tokenizer, "chat_template", None)


def load_processor(model_dir: str | Path) -> VlrlQwenVLProcessor:
    """Load the tokenizer, image processor and chat template of a local Qwen-VL model directory.

    Only local files are read. Works for `build_tiny_model` outputs and for downloaded
    Qwen3-VL checkpoints (tokenizer.json + preprocessor_config.json).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise VlrlError(f"model path {model_dir} does not exist; pass a local model directory")
    # Releases keep the image processor in preprocessor_config.json; transformers 5's
    # processor.save_pretrained nests it in processor_config.json. Both are read.
    if not ((model_dir / "preprocessor_config.json").is_file() or (model_dir / "processor_config.json").is_file()):
        raise VlrlError(
            f"{model_dir} has no preprocessor_config.json; a Qwen-VL model directory needs its image "
            "processor config (re-download the checkpoint or rebuild it with `vlrl model init-tiny`)"
        )
    if not ((model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file()):
        raise VlrlError(f"{model_dir} has no tokenizer files (tokenizer.json); it is not a complete model directory")

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    # The PIL backend of the Qwen2-VL image processor is the one Qwen3-VL uses, minus torchvision.
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir), local_files_only=True)
    chat_template = _read_chat_template(model_dir, tokenizer)
    if chat_template is None:
        raise VlrlError(
            f"{model_dir} has no chat template (chat_template.jinja, chat_template.json or in the tokenizer config)"
        )
    if tokenizer.chat_template is None:
        tokenizer.chat_template = chat_template  # so tokenizer.apply_chat_template works as well
    return VlrlQwenVLProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)
