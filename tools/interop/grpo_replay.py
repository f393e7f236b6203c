#!/usr/bin/env python3
"""Replays a `tessera train` run of loss/grpo in plain PyTorch with TRL 1.16's formulas, the
reference tests/integration/grpo_test.cpp checks Tessera against.

    grpo_replay.py BASE_DIR RUN_DIR EXPORT_DIR --steps S --lr LR --num-generations G
                   --micro-batch-size B --grad-accum A [--ranks R] [--temperature T] [--beta BETA]
                   [--epsilon E] [--epsilon-high EH] [--loss-type dapo|grpo|bnpo|dr_grpo]
                   [--importance-sampling-level token|sequence] [--num-iterations I]
                   [--max-completion-length L] [--scale-rewards group|batch|none] [--adapter DIR]

BASE_DIR: the Hugging Face Llama the run started from; with --adapter, the PEFT folder of the
run's first export, whose lora_A matrices are the starting ones (lora_B starts at zero, so the
first step leaves A as it was), trained over the frozen base. RUN_DIR: the run's
folder, whose rollouts.jsonl holds every completion (step, prompt_ids, completion_ids, rewards,
advantage) and metrics.jsonl each step's loss; EXPORT_DIR: the run's Hugging Face export after
step S (a PEFT folder with --adapter). For each step the rollout it trains on (sampled at that step, or num_iterations - 1 steps
before) is read back; its advantages are recomputed from the logged rewards (TRL's
sum_then_normalize, all ranks' completions together); each rank's rows form micro-batches of B in
file order; a token's log-probability is log_softmax(logits / T) of the model being trained, the
old one that of the weights that sampled it (num_iterations > 1; else the same, detached), the
reference one that of BASE_DIR's weights (beta > 0; with an adapter: the adapter switched off). The loss is TRL's _compute_loss summed over
micro-batches and ranks and divided by the step's units, then one plain SGD step (param -= lr *
grad). Prints {"losses", "tessera_losses", "advantage_error", "weight_error", "update"}.
"""
import argparse
import contextlib
import copy
import json
import pathlib

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def read_jsonl(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


def advantages_of(rows, G, scale):
    rewards = torch.tensor([sum(v for v in r["rewards"].values() if v is not None) for r in rows], dtype=torch.float32)
    grouped = rewards.view(-1, G)
    mean = grouped.mean(1).repeat_interleave(G)
    std = grouped.std(1).repeat_interleave(G) if scale != "batch" else rewards.std().expand_as(rewards)
    adv = rewards - mean
    return adv / (std + 1e-4) if scale != "none" else adv


def batch_of(rows):
    width = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    targets = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        p, c = r["prompt_ids"], r["completion_ids"]
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        for t, token in enumerate(c):
            targets[i, len(p) - 1 + t] = token
            mask[i, len(p) - 1 + t] = 1
    return ids, targets, mask


def token_logps(model, ids, targets, temperature):
    logits = model(ids).logits.float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def micro_batch_loss(a, logps, old, ref, adv, mask):
    log_ratio = logps - old
    if a.importance_sampling_level == "sequence":
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_w = log_ratio
    coef_1 = torch.exp(log_w)
    coef_2 = torch.clamp(coef_1, 1 - a.epsilon, 1 + (a.epsilon_high if a.epsilon_high is not None else a.epsilon))
    per_token = -torch.min(coef_1 * adv.unsqueeze(1), coef_2 * adv.unsqueeze(1))
    if a.beta != 0.0:
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token = per_token + a.beta * kl * coef_1
    masked = per_token * mask
    if a.loss_type == "dapo":
        return masked.sum(), mask.sum().clamp(min=1.0)
    if a.loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum(), torch.tensor(float(len(mask)))
    if a.loss_type == "dr_grpo":
        return masked.sum() / a.max_completion_length, torch.tensor(float(len(mask)))
    return masked.sum() / mask.sum().clamp(min=1.0), torch.tensor(1.0)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("run")
    parser.add_argument("export")
    for name, kind, default in [("steps", int, 3), ("lr", float, 1e-2), ("num-generations", int, 4),
                                ("micro-batch-size", int, 4), ("grad-accum", int, 1), ("ranks", int, 1),
                                ("temperature", float, 1.0), ("beta", float, 0.0), ("epsilon", float, 0.2),
                                ("epsilon-high", float, None), ("num-iterations", int, 1),
                                ("max-completion-length", int, 8)]:
        parser.add_argument("--" + name, type=kind, default=default)
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--importance-sampling-level", default="token")
    parser.add_argument("--scale-rewards", default="group")
    parser.add_argument("--adapter")
    a = parser.parse_args(argv)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.base, dtype=torch.float32)
    reference = None
    if a.adapter:
        from peft import PeftModel, get_peft_model_state_dict
        model = PeftModel.from_pretrained(model, a.adapter, is_trainable=True)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.zero_()
        trained = lambda: get_peft_model_state_dict(model)  # noqa: E731  (PEFT's saved names)
        export_file = "adapter_model.safetensors"
    else:
        if a.beta != 0.0:
            reference = copy.deepcopy(model).eval()
        trained = model.state_dict
        export_file = "model.safetensors"
    start = {k: v.detach().clone() for k, v in trained().items()}
    rollouts = read_jsonl(pathlib.Path(a.run) / "rollouts.jsonl")
    metrics = [m for m in read_jsonl(pathlib.Path(a.run) / "metrics.jsonl") if "eval" not in m]
    per_rank = a.micro_batch_size * a.grad_accum
    losses, advantage_error, sampled = [], 0.0, {}
    for step in range(1, a.steps + 1):
        rollout_step = step - (step - 1) % a.num_iterations
        rows = [r for r in rollouts if r["step"] == rollout_step]
        assert len(rows) == per_rank * a.ranks, f"step {rollout_step} has {len(rows)} completions"
        advantages = advantages_of(rows, a.num_generations, a.scale_rewards)
        advantage_error = max(advantage_error,
                              (advantages - torch.tensor([r["advantage"] for r in rows])).abs().max().item())
        batches = [batch_of(rows[i: i + a.micro_batch_size]) for i in range(0, len(rows), a.micro_batch_size)]
        if rollout_step == step and a.num_iterations > 1:
            with torch.no_grad():
                sampled = {i: token_logps(model, ids, targets, a.temperature) for i, (ids, targets, _) in enumerate(batches)}
        model.zero_grad()
        total, units = 0.0, 0.0
        for i, (ids, targets, mask) in enumerate(batches):
            logps = token_logps(model, ids, targets, a.temperature)
            old = sampled[i] if a.num_iterations > 1 else logps.detach()
            ref = None
            if a.beta != 0.0:
                with torch.no_grad(), (model.disable_adapter() if a.adapter else contextlib.nullcontext()):
                    ref = token_logps(reference if reference is not None else model, ids, targets, a.temperature)
            adv = advantages[i * a.micro_batch_size: (i + 1) * a.micro_batch_size]
            s, u = micro_batch_loss(a, logps, old, ref, adv, mask)
            total = total + s
            units += float(u)
        loss = total / units
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= a.lr * p.grad
        losses.append(loss.item())
    ours = load_file(str(pathlib.Path(a.export) / export_file))
    weight_error, update = 0.0, 0.0
    for name, value in trained().items():
        assert name in ours, f"{name} is not in {a.export}"
        weight_error = max(weight_error, (ours[name].float() - value).abs().max().item())
        update = max(update, (value - start[name]).abs().max().item())
    print(json.dumps({"losses": losses, "tessera_losses": [m["loss"] for m in metrics[: a.steps]],
                      "advantage_error": advantage_error, "weight_error": weight_error, "update": update}))


if __name__ == "__main__":
    main()
