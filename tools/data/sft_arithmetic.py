#!/usr/bin/env python3
"""The data of configs/sft-tiny.yaml: additions as supervised fine-tuning examples,
{"prompt": "Q: 12+345=", "response": " 357"}, in JSON lines (a fixed seed; the held-out file
shares no example with the training file).

    tools/data/sft_arithmetic.py --out data/sft-arithmetic [--train 20000] [--val 500] [--max-operand 999]

It also writes preferences.jsonl, the training additions as preference pairs for
configs/dpo-tiny.yaml: {"prompt", "chosen": the sum, "rejected": an evasive word instead of a number},
and prompts.jsonl and val_prompts.jsonl, the questions with their sums for reinforcement learning
(configs/grpo-tiny.yaml): {"prompt": "Q: 12+345=", "answer": "357"}.

Only the response is a target in dataset/sft_jsonl, so the model is trained to answer, not to
reproduce the questions; the evaluation loss is the loss on answers alone.
"""
import argparse
import json
import pathlib
import random


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--val", type=int, default=500)
    p.add_argument("--max-operand", type=int, default=999, help="the operands' largest value (99: two digits)")
    args = p.parse_args()
    if args.train + args.val > (args.max_operand + 1) ** 2:
        p.error(f"there are only {(args.max_operand + 1) ** 2} distinct additions of operands up to {args.max_operand}")
    rng = random.Random(0)
    seen, examples = set(), []
    while len(examples) < args.train + args.val:
        a, b = rng.randint(0, args.max_operand), rng.randint(0, args.max_operand)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        examples.append({"prompt": f"Q: {a}+{b}=", "response": f" {a + b}\n"})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("val", examples[:args.val]), ("train", examples[args.val:])):
        with open(out / f"{name}.jsonl", "w") as f:
            for ex in part:
                f.write(json.dumps(ex) + "\n")
    with open(out / "preferences.jsonl", "w") as f:
        for ex in examples[args.val:]:
            evasive = rng.choice([" many", " some", " maybe", " unknown", " lots"])
            f.write(json.dumps({"prompt": ex["prompt"], "chosen": ex["response"], "rejected": f"{evasive}\n"}) + "\n")
    for name, part in (("val_prompts", examples[:args.val]), ("prompts", examples[args.val:])):
        with open(out / f"{name}.jsonl", "w") as f:
            for ex in part:
                f.write(json.dumps({"prompt": ex["prompt"], "answer": ex["response"].strip()}) + "\n")
    print(f"{out}: {args.train} training and {args.val} held-out additions, the training ones as preference pairs, "
          "and both as prompts with their answers")


if __name__ == "__main__":
    main()
