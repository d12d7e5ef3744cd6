import math

import torch


def init_local_vision_attention(visual, offset: int, strength: float) -> None:
    """Bias every vision attention head towards one neighbouring patch (ConViT-style)."""
    inv_freq = visual.rotary_pos_emb.inv_freq.float()  # [F]: the same frequencies on both axes
    nf = inv_freq.numel()
    dirs = [(-offset, 0), (offset, 0), (0, -offset), (0, offset)]
    for blk in visual.blocks:
        attn = blk.attn
        hd = attn.head_dim
        assert hd == 4 * nf, (hd, nf)
        bias = attn.qkv.bias.data.view(3, attn.num_heads, hd)
        for h in range(attn.num_heads):
            dh, dw = dirs[h % 4]
            amp = math.sqrt(strength)
            # complex pair (d, d + hd/2); d < nf: height frequency, nf <= d < 2nf: width frequency
            ang = torch.cat([inv_freq * dh, inv_freq * dw])
            q = torch.cat([amp * torch.cos(ang), amp * torch.sin(ang)])
            k = torch.cat([torch.full((2 * nf,), amp), torch.zeros(2 * nf)])
            bias[0, h] = q
            bias[1, h] = k


def attention_probs(visual, pixels, grid):
    """Per block, per head, the attention probabilities [heads, N, N] of one image."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl as M

    out = []
    hooks = []

    def hook(mod, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        cos, sin = kwargs["position_embeddings"]
        n = x.shape[0]
        q, k, v = mod.qkv(x).reshape(n, 3, mod.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = M.apply_rotary_pos_emb_vision(q, k, cos, sin)
        s = torch.einsum("nhd,mhd->hnm", q, k) * mod.scaling
        out.append(s.softmax(-1))

    for blk in visual.blocks:
        hooks.append(blk.attn.register_forward_pre_hook(hook, with_kwargs=True))
    with torch.no_grad():
        visual(pixels, grid_thw=grid)
    for h in hooks:
        h.remove()
    return out
