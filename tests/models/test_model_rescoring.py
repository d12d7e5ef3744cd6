"""GRPO's premise: re-scoring sampled tokens with one full forward (teacher forcing) gives the
same log-probs that generate() sampled them with."""

from __future__ import annotations

import pytest
import torch
from model_helpers import chat_inputs, maze_like_image

from vlrl.models import apply_lora, load_policy_model, vision_special_token_ids


@pytest.mark.parametrize("with_lora", [False, True])
def test_teacher_forcing_matches_generate_logprobs(tiny_dir, processor, with_lora):
    model = load_policy_model(tiny_dir)
    if with_lora:
        model = apply_lora(model, rank=4, alpha=8, seed=0)
        with torch.no_grad():  # make the adapter non-trivial
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    model.eval()
    # Prompts of different lengths, so left padding is exercised.
    enc = chat_inputs(
        processor,
        ["You are the blue circle. Move to the red square.", "Cannot move into a wall."],
        [maze_like_image(80, 0), maze_like_image(112, 1)],
    )
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            max_new_tokens=16,
            suppress_tokens=vision_special_token_ids(processor),
            output_logits=True,
            return_dict_in_generate=True,
        )
    prompt_len = enc["input_ids"].shape[1]
    completion = out.sequences[:, prompt_len:]
    sampled_logprobs = torch.stack(out.logits, dim=1).log_softmax(-1).gather(-1, completion[..., None])[..., 0]

    # mm_token_type_ids are zero over the completion: it holds no image tokens.
    with torch.no_grad():
        logits = model(
            input_ids=out.sequences,
            attention_mask=torch.cat([enc["attention_mask"], torch.ones_like(completion)], dim=1),
            mm_token_type_ids=torch.cat([enc["mm_token_type_ids"], torch.zeros_like(completion)], dim=1),
            pixel_values=enc["pixel_values"],
            image_grid_thw=enc["image_grid_thw"],
        ).logits
    rescored = logits[:, prompt_len - 1 : -1].log_softmax(-1).gather(-1, completion[..., None])[..., 0]
    torch.testing.assert_close(rescored, sampled_logprobs, atol=1e-5, rtol=0)
