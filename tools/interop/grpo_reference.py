#!/usr/bin/env python3
"""The reference of Tessera's GRPO pieces: TRL's own lines (trl==1.16.0, GRPOTrainer
._generate_and_score_completions, multi_objective_aggregation "sum_then_normalize") on the same
inputs.

    grpo_reference.py advantages CASES.json OUT.json

CASES: [{"scores": [[float | null, ...], ...], "weights": [...], "num_generations": G,
"scale_rewards": "group" | "batch" | "none"}, ...] (null: a reward function's None). OUT: for each
case {"rewards": [...], "advantages": [...], "zero_std": [...]}, NaN written as null.
"""
import json
import math
import sys

import torch
from trl.trainer.utils import nanstd


def advantages(case):
    rewards_per_func = torch.tensor([[math.nan if v is None else v for v in row] for row in case["scores"]],
                                    dtype=torch.float32)
    reward_weights = torch.tensor(case["weights"], dtype=torch.float32)
    num_generations, scale_rewards = case["num_generations"], case["scale_rewards"]
    # TRL 1.16.0, grpo_trainer.py, sum_then_normalize:
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if num_generations > 1:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    adv = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        adv = adv / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    adv = torch.nan_to_num(adv, nan=0.0)
    nan_free = lambda t: [None if math.isnan(v) else v for v in t.tolist()]
    return {"rewards": nan_free(rewards), "advantages": nan_free(adv), "zero_std": is_std_zero.tolist()}


def main(argv):
    if len(argv) != 4 or argv[1] != "advantages":
        sys.exit(__doc__)
    with open(argv[2]) as f:
        cases = json.load(f)
    with open(argv[3], "w") as f:
        json.dump([advantages(c) for c in cases], f)


if __name__ == "__main__":
    main(sys.argv)
