#!/usr/bin/env python3
"""transformers' DeepseekV3Attention (multi-head latent attention) as the reference for the kit's
MultiHeadLatentAttention (tests/unit/kit_latent_attention_test.cpp).

    mla_reference.py OUT.safetensors [--q-lora-rank R] [--yarn] [--seed S]

Builds one attention layer from a tiny DeepseekV3Config (hidden 32, 4 heads, kv_lora_rank 16,
qk_nope 8, qk_rope 4, v_head_dim 6; YaRN with mscale_all_dim when --yarn), gives every weight,
bias and norm gain random values, runs it causally on a random x [2, 7, 32], and writes x, the
rotary tables it used ("cos", "sin" as [2, 1, 7, 4]), its output "y", its softmax "scale" and each
parameter as "w.NAME" into OUT.
"""
import argparse

import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--q-lora-rank", type=int, default=0)
    p.add_argument("--yarn", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if a.yarn:
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    config = DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                              q_lora_rank=a.q_lora_rank or None, kv_lora_rank=16, qk_nope_head_dim=8,
                              qk_rope_head_dim=4, v_head_dim=6, max_position_embeddings=64, attention_bias=True,
                              rope_parameters=rope, rope_interleave=True, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    torch.manual_seed(a.seed)
    layer = DeepseekV3Attention(config, 0).eval()
    with torch.no_grad():
        for name, param in layer.named_parameters():
            base = 1.0 if "layernorm" in name else 0.0
            param.copy_(base + 0.3 * torch.randn(param.shape))
    x = torch.randn(2, 7, 32)
    positions = torch.arange(7).unsqueeze(0).expand(2, -1)
    cos, sin = DeepseekV3RotaryEmbedding(config)(x, positions)
    mask = torch.full((7, 7), float("-inf")).triu(1).view(1, 1, 7, 7)
    with torch.no_grad():
        y, _ = layer(x, (cos, sin), mask)
    tensors = {"x": x, "cos": cos.unsqueeze(1).contiguous(), "sin": sin.unsqueeze(1).contiguous(), "y": y,
               "scale": torch.tensor([layer.scaling], dtype=torch.float64)}
    for name, param in layer.named_parameters():
        tensors["w." + name] = param.detach().contiguous()
    save_file(tensors, a.out)


if __name__ == "__main__":
    main()
