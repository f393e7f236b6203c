#!/usr/bin/env python3
"""Turns text files into flat token files for dataset/tokens, with the byte-level tokenizer
(token id = byte value, vocabulary 256) that model/gpt's quickstart and sample_text use.

  tools/data/text_to_tokens.py FILE_OR_DIR... --out data/fortunes [--val-fraction 0.05]

writes OUT/train.bin and OUT/val.bin (uint16 little-endian, or --dtype uint32) and OUT/meta.json.
Directories are read recursively in sorted order; `--exclude NAME` skips files by name.
The split is by whole documents (files, or `%`-separated fortunes with --fortune-split) so no
text is shared between train and val.
"""
import argparse
import array
import json
import os
import random
import sys


def documents(paths, exclude, fortune_split):
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, n) for n in names]
        elif os.path.isfile(p):
            files.append(p)
        else:
            sys.exit(f"text_to_tokens: {p}: no such file or directory")
    for f in sorted(set(files)):
        name = os.path.basename(f)
        if name in exclude or name.endswith(".dat") or os.path.islink(f):
            continue
        data = open(f, "rb").read()
        if b"\0" in data:
            continue  # binary, not text
        if fortune_split:
            for doc in data.split(b"\n%\n"):
                if doc.strip():
                    yield doc.strip(b"%\n") + b"\n\n"
        else:
            yield data


def write_tokens(path, data, dtype):
    tokens = array.array("H" if dtype == "uint16" else "I", list(data))
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(path, "wb") as out:
        tokens.tofile(out)
    return len(tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--dtype", choices=["uint16", "uint32"], default="uint16")
    ap.add_argument("--exclude", action="append", default=[], help="file name to skip")
    ap.add_argument("--fortune-split", action="store_true", help="split files at %% lines")
    ap.add_argument("--seed", type=int, default=0, help="seed of the train/val document split")
    args = ap.parse_args()
    if not 0 <= args.val_fraction < 1:
        sys.exit("text_to_tokens: --val-fraction must be in [0, 1)")

    docs = list(documents(args.inputs, set(args.exclude), args.fortune_split))
    if not docs:
        sys.exit("text_to_tokens: no text found in " + " ".join(args.inputs))
    random.Random(args.seed).shuffle(docs)
    n_val = int(round(len(docs) * args.val_fraction))
    val, train = docs[:n_val], docs[n_val:]
    os.makedirs(args.out, exist_ok=True)
    n_train = write_tokens(os.path.join(args.out, "train.bin"), b"".join(train), args.dtype)
    n_val_tokens = write_tokens(os.path.join(args.out, "val.bin"), b"".join(val), args.dtype)
    meta = {"tokenizer": "bytes", "vocab_size": 256, "dtype": args.dtype,
            "train_tokens": n_train, "val_tokens": n_val_tokens, "documents": len(docs),
            "sources": args.inputs}
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"{args.out}: {n_train} train tokens, {n_val_tokens} val tokens from {len(docs)} documents")


if __name__ == "__main__":
    main()
