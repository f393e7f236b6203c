#!/usr/bin/env python3
"""The reference of Tessera's GRPO pieces: TRL's own lines (trl==1.16.0, GRPOTrainer
._generate_and_score_completions, multi_objective_aggregation "sum_then_normalize") on the same
inputs.

    grpo_reference.py advantages CASES.json OUT.json
    grpo_reference.py objective CASES.json OUT.json

advantages: CASES [{"scores": [[float | null, ...], ...], "weights": [...], "num_generations": G,
"scale_rewards": "group" | "batch" | "none"}, ...] (null: a reward function's None). OUT: for each
case {"rewards": [...], "advantages": [...], "zero_std": [...]}, NaN written as null.

objective: CASES [{"logps", "old_logps" (or null), "ref_logps" (or null), "advantages", "mask",
"loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta" (or null), "beta",
"max_completion_length"}, ...], one micro-batch each (no accumulation, one process), run through
TRL's own GRPOTrainer._compute_loss with GRPOConfig's defaults for the rest. OUT: for each
{"loss", "grad" (of the loss by logps), "kl", "low_clip", "high_clip"} as it computes and logs
them (kl null without beta), and the use_bias_correction_kl default it ran with.
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


def objective(case):
    """TRL's own GRPOTrainer._compute_loss on one micro-batch of one process, called on a stand-in
    trainer whose model returns the case's log-probabilities: every line and default is TRL's."""
    from types import SimpleNamespace

    from trl import GRPOConfig, GRPOTrainer

    t = lambda v: None if v is None else torch.tensor(v, dtype=torch.float64)
    per_token_logps = t(case["logps"]).requires_grad_(True)
    mask = t(case["mask"])
    rows, length = mask.shape
    # The arguments as GRPOConfig defaults them (use_bias_correction_kl and the rest), with the case's.
    args = GRPOConfig(output_dir="/tmp/grpo-reference", loss_type=case["loss_type"], beta=case["beta"],
                      epsilon=case["epsilon"], epsilon_high=case["epsilon_high"], delta=case["delta"],
                      importance_sampling_level=case["importance_sampling_level"],
                      use_bias_correction_kl=case.get("use_bias_correction_kl", True),
                      max_completion_length=case["max_completion_length"], report_to=[], use_cpu=True,
                      bf16=False)
    metrics = {"train": __import__("collections").defaultdict(list)}
    accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                  reduce=lambda x, reduction="sum": x)
    stand_in = SimpleNamespace(
        args=args, beta=args.beta, loss_type=args.loss_type, epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
        importance_sampling_level=args.importance_sampling_level, top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=getattr(args, "off_policy_mask_threshold", None), use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=args.max_completion_length,
        accelerator=accelerator, _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics=metrics,
        _get_per_token_logps_and_entropies=lambda *a, **k: (per_token_logps, torch.zeros_like(per_token_logps), None))
    args.steps_per_generation = 1  # one micro-batch is the whole generation batch
    inputs = {"prompt_ids": torch.zeros(rows, 1, dtype=torch.long), "prompt_mask": torch.ones(rows, 1),
              "completion_ids": torch.zeros(rows, length, dtype=torch.long), "completion_mask": mask,
              "advantages": t(case["advantages"]), "num_items_in_batch": mask.sum()}
    if case["old_logps"] is not None:
        inputs["old_per_token_logps"] = t(case["old_logps"])
    if case["ref_logps"] is not None:
        inputs["ref_per_token_logps"] = t(case["ref_logps"])
    loss = GRPOTrainer._compute_loss(stand_in, None, inputs)
    loss.backward()
    m = metrics["train"]
    return {"loss": loss.item(), "grad": per_token_logps.grad.tolist(),
            "kl": m["kl"][-1] if case["beta"] != 0.0 else None,
            "low_clip": m["clip_ratio/low_mean"][-1], "high_clip": m["clip_ratio/high_mean"][-1],
            "use_bias_correction_kl": args.use_bias_correction_kl}


def main(argv):
    if len(argv) != 4 or argv[1] not in ("advantages", "objective"):
        sys.exit(__doc__)
    with open(argv[2]) as f:
        cases = json.load(f)
    with open(argv[3], "w") as f:
        json.dump([(advantages if argv[1] == "advantages" else objective)(c) for c in cases], f)


if __name__ == "__main__":
    main(sys.argv)
