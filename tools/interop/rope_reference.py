#!/usr/bin/env python3
"""transformers' rotary tables as the reference for Tessera's RotaryEmbedding (the kit test).

    rope_reference.py --head-dim D --positions P --theta T [--yarn FACTOR ORIGINAL] [--beta-fast B]
                      [--beta-slow B] [--mscale M --mscale-all-dim M] [--attention-factor A]

Prints one JSON line {"cos": [[...] * P], "sin": [...]} of float32 values for positions 0 .. P-1,
computed by transformers' own rotary embedding class from a config (nothing is downloaded).
"""
import argparse
import json

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--positions", type=int, required=True)
    p.add_argument("--theta", type=float, default=10000.0)
    p.add_argument("--yarn", type=float, nargs=2, metavar=("FACTOR", "ORIGINAL"))
    p.add_argument("--beta-fast", type=float)
    p.add_argument("--beta-slow", type=float)
    p.add_argument("--mscale", type=float)
    p.add_argument("--mscale-all-dim", type=float)
    p.add_argument("--attention-factor", type=float)
    a = p.parse_args()
    rope = {"rope_type": "default", "rope_theta": a.theta}
    if a.yarn:
        rope = {"rope_type": "yarn", "rope_theta": a.theta, "factor": a.yarn[0],
                "original_max_position_embeddings": int(a.yarn[1])}
        for key, value in (("beta_fast", a.beta_fast), ("beta_slow", a.beta_slow), ("mscale", a.mscale),
                           ("mscale_all_dim", a.mscale_all_dim), ("attention_factor", a.attention_factor)):
            if value is not None:
                rope[key] = value
    config = LlamaConfig(hidden_size=a.head_dim * 2, num_attention_heads=2, head_dim=a.head_dim,
                         max_position_embeddings=a.positions, rope_parameters=rope)
    rotary = LlamaRotaryEmbedding(config)
    x = torch.zeros(1, a.positions, a.head_dim)
    cos, sin = rotary(x, torch.arange(a.positions).unsqueeze(0))
    print(json.dumps({"cos": cos[0].tolist(), "sin": sin[0].tolist()}))


if __name__ == "__main__":
    main()
