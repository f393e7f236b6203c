#!/usr/bin/env python3
"""Python's tokenizers and sentencepiece as the reference for Tessera's tokenizer tests.

    tokenizer_reference.py corpus FILE [--lines N]         a varied corpus, one document a line
    tokenizer_reference.py train-bpe DIR --style gpt2|llama3 --corpus FILE [--vocab V]
    tokenizer_reference.py train-sp FILE_PREFIX --type unigram|bpe --corpus FILE [--vocab V]
    tokenizer_reference.py encode KIND PATH --corpus FILE --out IDS.jsonl
    tokenizer_reference.py join-encode TOKENIZER_JSON INPUT... [--field F] --out IDS.json

`corpus` writes lines mixing ASCII, accented Latin, Greek, Cyrillic, CJK, emoji (also joined
with ZWJ), whitespace runs and tabs, digits of every length, punctuation and contractions, and
the special token <|endoftext|> inline. `train-bpe` trains a byte-level BPE with `tokenizers`
the way GPT-2 (ByteLevel pre-tokenizer) or Llama 3 (a regex Split, then ByteLevel without regex,
ignore_merges) is built and saves tokenizer.json; `train-sp` trains a SentencePiece model.
`encode` writes the ids of every corpus line, one JSON list a line (KIND: bpe or sentencepiece).

The sentencepiece package is pinned to 0.1.99 (tools/setup.sh): Tessera links Debian's
libsentencepiece 0.1.97, and 0.2.x breaks ties between equal-scored segmentations differently
(runs of spaces, for one), so 0.2.x ids differ from the library's on some lines.
"""
import argparse
import json
import random
import sys

SPECIAL = "<|endoftext|>"


def make_corpus(args):
    rng = random.Random(args.seed)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "naïve", "café", "résumé", "Straße",
             "façade", "coöperate", "Ελληνικά", "λόγος", "Русский", "язык", "日本語", "中文字符", "한국어", "ไทย",
             "עברית", "العربية", "हिन्दी", "I'm", "you're", "they've", "we'll", "she'd", "it's", "DON'T", "HELLO",
             "x86_64", "e-mail", "co-op", "$100", "3.14159", "1,000,000", "2026-11-23", "v1.2.3", "#hashtag",
             "@user", "https://example.com/a?b=c", "C++", "a/b", "(parens)", "[brackets]", "{braces}", "🙂",
             "👩‍💻", "🇩🇪", "🚀🚀", "∑∫√", "—", "…", "«quotes»", "“curly”", "‘single’"]
    spaces = [" ", " ", " ", "  ", "   ", "\t", " \t ", "    ", "\u00a0", "\u3000"]
    lines = []
    for i in range(args.lines):
        n = rng.randint(1, 18)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.08:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
            elif r < 0.11:
                parts.append(SPECIAL)
            else:
                parts.append(rng.choice(words))
            parts.append(rng.choice(spaces))
        line = "".join(parts)
        if rng.random() < 0.2:
            line = rng.choice(spaces) + line  # leading whitespace
        lines.append(line.replace("\n", " "))
    with open(args.file, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def read_corpus(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_bpe(args):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if args.style == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=[SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(read_corpus(args.corpus), trainer)
    import pathlib
    pathlib.Path(args.dir).mkdir(parents=True, exist_ok=True)
    tok.save(str(pathlib.Path(args.dir) / "tokenizer.json"))


def train_sp(args):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(input=args.corpus, model_prefix=args.prefix, vocab_size=args.vocab,
                                   model_type=args.type, character_coverage=1.0, byte_fallback=args.type == "bpe",
                                   user_defined_symbols=[SPECIAL], num_threads=1, minloglevel=2)


def encode(args):
    lines = read_corpus(args.corpus)
    if args.kind == "bpe":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(args.path)
        ids = [tok.encode(line, add_special_tokens=False).ids for line in lines]
    else:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=args.path)
        ids = [sp.encode(line) for line in lines]
    with open(args.out, "w") as f:
        for row in ids:
            f.write(json.dumps(row) + "\n")


def join_encode(args):
    """What `tessera prepare-data` must write: each document's ids (tokenizers, no special tokens
    added), EOS between documents; documents are JSONL lines' field or whole text files."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    docs = []
    for path in args.inputs:
        if path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as f:
                docs += [json.loads(line)[args.field] for line in f if line.strip()]
        else:
            with open(path, encoding="utf-8", newline="") as f:
                docs.append(f.read())
    eos = tok.token_to_id(args.eos)
    ids = []
    for i, doc in enumerate(docs):
        if i > 0:
            ids.append(eos)
        ids += tok.encode(doc, add_special_tokens=False).ids
    with open(args.out, "w") as f:
        json.dump({"documents": len(docs), "ids": ids}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("file")
    c.add_argument("--lines", type=int, default=3000)
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(fn=make_corpus)
    b = sub.add_parser("train-bpe")
    b.add_argument("dir")
    b.add_argument("--style", choices=["gpt2", "llama3"], required=True)
    b.add_argument("--corpus", required=True)
    b.add_argument("--vocab", type=int, default=1000)
    b.set_defaults(fn=train_bpe)
    s = sub.add_parser("train-sp")
    s.add_argument("prefix")
    s.add_argument("--type", choices=["unigram", "bpe"], required=True)
    s.add_argument("--corpus", required=True)
    s.add_argument("--vocab", type=int, default=800)
    s.set_defaults(fn=train_sp)
    e = sub.add_parser("encode")
    e.add_argument("kind", choices=["bpe", "sentencepiece"])
    e.add_argument("path")
    e.add_argument("--corpus", required=True)
    e.add_argument("--out", required=True)
    e.set_defaults(fn=encode)
    j = sub.add_parser("join-encode")
    j.add_argument("tokenizer")
    j.add_argument("inputs", nargs="+")
    j.add_argument("--field", default="text")
    j.add_argument("--eos", default=SPECIAL)
    j.add_argument("--out", required=True)
    j.set_defaults(fn=join_encode)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
