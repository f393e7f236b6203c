#!/usr/bin/env python3
"""DPO in plain PyTorch + PEFT, the reference loss/dpo is tested against
(tests/integration/dpo_test.cpp).

    dpo_reference.py BASE_DIR ADAPTER_DIR PAIRS.jsonl --steps N --pairs-per-step P --lr LR
                     [--beta B] [--loss-type sigmoid|ipo|hinge] [--label-smoothing E]

BASE_DIR: a Hugging Face causal LM folder; ADAPTER_DIR: a PEFT LoRA folder whose lora_A matrices
are the run's starting ones (lora_B is set to zero, PEFT's and Tessera's start), or `-` for full
fine-tuning: every weight trained, the reference a frozen copy of the starting model (TRL's
ref_model). PAIRS: JSON lines
{prompt, chosen, rejected} as texts, tokenised as bytes (Tessera's tokenizer/bytes: no BOS/EOS).
Each step takes the next P pairs in file order; a sequence's log-probability sums log p(token)
over its completion (ipo: their mean), the reference's with the adapter disabled, and the loss is
TRL's DPOTrainer formula averaged over the step's pairs, then one torch.optim.AdamW step
(betas 0.9/0.999, eps 1e-8, no weight decay, as the test's spec). Prints
{"losses": [...], "metrics": [{rewards/..., logps/...}, ...]} per step.

    dpo_reference.py eval POLICY_DIR REFERENCE_DIR PAIRS.jsonl [--adapter ADAPTER_DIR] [--beta B]

TRL's evaluation metrics of a trained policy on held-out pairs, without gradients: POLICY_DIR a
Hugging Face folder (a full fine-tuning's export), or with --adapter the base REFERENCE_DIR with a
PEFT adapter over it; the reference is REFERENCE_DIR (with an adapter: the base, adapter off).
Prints {"loss", "rewards/chosen", ..., "logps/rejected"}, the sigmoid loss and means over every pair.
"""
import argparse
import contextlib
import copy
import json

import torch
import torch.nn.functional as F


def sequence_logps(model, rows):
    """Summed completion log-probabilities and completion lengths of (prompt, completion) rows."""
    sums, counts = [], []
    for prompt, completion in rows:
        ids = torch.tensor([list(prompt + completion)])
        logits = model(ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        n = len(completion)
        sums.append(logp[-n:].sum())
        counts.append(n)
    return torch.stack(sums), torch.tensor(counts, dtype=torch.float32)


def evaluate(argv):
    p = argparse.ArgumentParser()
    p.add_argument("policy")
    p.add_argument("reference")
    p.add_argument("pairs")
    p.add_argument("--adapter")
    p.add_argument("--beta", type=float, default=0.1)
    a = p.parse_args(argv)

    from transformers import AutoModelForCausalLM

    load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    reference = load(a.reference)
    if a.adapter:
        from peft import PeftModel
        policy = PeftModel.from_pretrained(reference, a.adapter).eval()
    else:
        policy = load(a.policy)
    rows = []
    for line in open(a.pairs, encoding="utf-8"):
        if line.strip():
            pair = json.loads(line)
            prompt = pair["prompt"].encode("utf-8")
            rows += [(prompt, pair["chosen"].encode("utf-8")), (prompt, pair["rejected"].encode("utf-8"))]
    with torch.no_grad():
        logps, _ = sequence_logps(policy, rows)
        with policy.disable_adapter() if a.adapter else contextlib.nullcontext():
            ref, _ = sequence_logps(policy if a.adapter else reference, rows)
    chosen, rejected = logps[0::2].double(), logps[1::2].double()
    h = (chosen - rejected) - (ref[0::2].double() - ref[1::2].double())
    r_c, r_r = a.beta * (chosen - ref[0::2].double()), a.beta * (rejected - ref[1::2].double())
    print(json.dumps({"loss": float((-F.logsigmoid(a.beta * h)).mean()), "rewards/chosen": float(r_c.mean()),
                      "rewards/rejected": float(r_r.mean()), "rewards/accuracies": float((r_c > r_r).double().mean()),
                      "rewards/margins": float((r_c - r_r).mean()), "logps/chosen": float(chosen.mean()),
                      "logps/rejected": float(rejected.mean())}))


def main(argv=None):
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "eval":
        return evaluate(argv[1:])
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("adapter")
    p.add_argument("pairs")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--pairs-per-step", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--loss-type", default="sigmoid")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    a = p.parse_args(argv)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(a.base, dtype=torch.float32)
    frozen = None
    if a.adapter == "-":
        model = base
        frozen = copy.deepcopy(base).eval().requires_grad_(False)
    else:
        model = PeftModel.from_pretrained(base, a.adapter, is_trainable=True)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.zero_()
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=False)

    pairs = [json.loads(line) for line in open(a.pairs, encoding="utf-8") if line.strip()]
    losses, metrics = [], []
    for step in range(a.steps):
        batch = pairs[step * a.pairs_per_step:(step + 1) * a.pairs_per_step]
        rows = []
        for pair in batch:
            prompt = pair["prompt"].encode("utf-8")
            rows += [(prompt, pair["chosen"].encode("utf-8")), (prompt, pair["rejected"].encode("utf-8"))]
        policy, counts = sequence_logps(model, rows)
        with torch.no_grad(), (contextlib.nullcontext() if frozen is not None else model.disable_adapter()):
            reference, _ = sequence_logps(frozen if frozen is not None else model, rows)
        if a.loss_type == "ipo":
            policy, reference = policy / counts, reference / counts
        chosen, rejected = policy[0::2], policy[1::2]
        ref_chosen, ref_rejected = reference[0::2], reference[1::2]
        h = (chosen - rejected) - (ref_chosen - ref_rejected)
        if a.loss_type == "sigmoid":
            loss = -F.logsigmoid(a.beta * h) * (1 - a.label_smoothing) - F.logsigmoid(-a.beta * h) * a.label_smoothing
        elif a.loss_type == "ipo":
            loss = (h - 1 / (2 * a.beta)) ** 2
        else:
            loss = torch.relu(1 - a.beta * h)
        loss = loss.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        r_c = (a.beta * (chosen - ref_chosen)).detach()
        r_r = (a.beta * (rejected - ref_rejected)).detach()
        losses.append(float(loss))
        metrics.append({"rewards/chosen": float(r_c.mean()), "rewards/rejected": float(r_r.mean()),
                        "rewards/accuracies": float((r_c > r_r).float().mean()),
                        "rewards/margins": float((r_c - r_r).mean()),
                        "logps/chosen": float(chosen.detach().mean()), "logps/rejected": float(rejected.detach().mean())})
    print(json.dumps({"losses": losses, "metrics": metrics}))


if __name__ == "__main__":
    main()
