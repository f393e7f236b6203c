#!/usr/bin/env python3
"""The data of configs/llama-tiny-bpe.yaml: Debian's fortunes as JSON lines (one fortune a
document, 5% of them held out, by a fixed seed) and a byte-level BPE tokenizer trained on the
training part with Python's `tokenizers` (GPT-2's pre-tokenizer, <|endoftext|> as EOS).

    tools/data/fortunes_bpe.py --out data/fortunes-bpe [--vocab 4096]

writes OUT/train.jsonl, OUT/val.jsonl and OUT/tokenizer.json. `tessera prepare-data` then turns
the JSON lines into token files (tools/data/fortunes_bpe.sh does both steps).
"""
import argparse
import json
import pathlib
import random

FORTUNES = pathlib.Path("/usr/share/games/fortunes")


def fortunes():
    for path in sorted(FORTUNES.iterdir()):
        if path.is_symlink() or path.suffix in (".dat", ".u8") or path.name in ("art", "ascii-art"):
            continue
        text = path.read_bytes()
        if b"\0" in text:
            continue
        for doc in text.decode("utf-8", errors="replace").split("\n%\n"):
            doc = doc.strip("%\n")
            if doc.strip():
                yield doc


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, default=4096)
    args = p.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    docs = list(fortunes())
    random.Random(0).shuffle(docs)
    held = max(1, len(docs) // 20)
    splits = {"val": docs[:held], "train": docs[held:]}
    for name, part in splits.items():
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for doc in part:
                f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(splits["train"], trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(str(out / "tokenizer.json"))
    print(f"{out}: {len(splits['train'])} training and {held} held-out fortunes, a {args.vocab}-id BPE tokenizer")


if __name__ == "__main__":
    main()
