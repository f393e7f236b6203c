#!/usr/bin/env python3
"""Parquet files and `datasets` folders for `tessera prepare-data`'s tests and benchmark, written by
pyarrow and datasets themselves (tests/integration/parquet_input_test.cpp, tools/bench/tokenize).

    parquet_reference.py corpus DIR [--documents N]
        DIR/docs.jsonl: N documents {"text", "id", "meta": {"text"}} (multi-line, non-ASCII, one
        empty), and the same documents as Parquet, row groups of 700 rows:
        DIR/{snappy,zstd,gzip,none}.parquet (`none`: uncompressed, no dictionary encoding),
        DIR/large.parquet (large_string), DIR/dictionary.parquet (dictionary<int32, string>),
        DIR/nested.parquet (only the struct column meta.text) and DIR/shards/part-0000K.parquet
        (four files in order).
    parquet_reference.py datasets DIR JSONL
        DIR: datasets.Dataset.from_json(JSONL) saved with save_to_disk in two shards, and
        DIR.jsonl: the same dataset's to_json export.
    parquet_reference.py bad DIR
        DIR/nulls.parquet (a null text in row group 1), DIR/numbers.parquet (an int64 column
        `text`), DIR/utf8.parquet (invalid UTF-8 in the text), DIR/empty.parquet (zero bytes), DIR/truncated.parquet (the first half of
        snappy.parquet's bytes; run `corpus DIR` first).
    parquet_reference.py examples DIR
        Fine-tuning rows for dataset/sft_jsonl and dataset/preference_jsonl, each set as JSON lines
        and as tables with the same rows: DIR/chats.jsonl (messages, some with a `name` key) and
        DIR/chats.parquet (zstd, row groups of 7, with an int64 `id`, a dictionary `source` and a
        binary `image` column the datasets do not read), DIR/chats-shards/part-0000K.parquet
        (three files), DIR/chats-folder (datasets' save_to_disk of chats.parquet, two shards);
        DIR/pairs.{jsonl,parquet} (prompt, response); DIR/preferences.{jsonl,parquet} (prompt,
        chosen, rejected as messages, the preferences also as DIR/preferences.arrow, an Arrow
        IPC file); DIR/other.parquet (columns a, b only); DIR/types.parquet (a column of every
        kind of value: lists, a map, a fixed-size list, integers, booleans, a date, a dictionary,
        nulls) and DIR/types.jsonl, pyarrow's to_pylist of it.
    parquet_reference.py shard OUT --megabytes M
        OUT: a FineWeb-like shard (columns text, id, dump, url, language_score; snappy, row groups
        of 10,000 rows) of about M MB of text, for the benchmark.
"""
import argparse
import json
import os
import random


def documents(n):
    rng = random.Random(7)
    words = ["the", "model", "learns", "données", "über", "日本語", "🙂", "tokens", "a", "of", "Parquet", "zstd",
             "line\nbreak", "tab\there", "naïve", "résumé", "x" * 40, "Ω", "end."]
    docs = []
    for i in range(n):
        if i == 5:
            docs.append("")
            continue
        k = rng.randint(1, 60)
        docs.append(" ".join(rng.choice(words) for _ in range(k)))
    return docs


def corpus(args):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(args.dir, exist_ok=True)
    docs = documents(args.documents)
    with open(os.path.join(args.dir, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"id": i, "text": text, "meta": {"text": text}}, ensure_ascii=False) + "\n")
    ids = pa.array(range(len(docs)), pa.int64())
    plain = pa.table({"id": ids, "text": pa.array(docs, pa.string())})
    for codec in ("snappy", "zstd", "gzip"):
        pq.write_table(plain, os.path.join(args.dir, codec + ".parquet"), compression=codec, row_group_size=700)
    pq.write_table(plain, os.path.join(args.dir, "none.parquet"), compression="none", use_dictionary=False,
                   row_group_size=700)
    pq.write_table(pa.table({"id": ids, "text": pa.array(docs, pa.large_string())}),
                   os.path.join(args.dir, "large.parquet"), row_group_size=700)
    pq.write_table(pa.table({"id": ids, "text": pa.array(docs, pa.string()).dictionary_encode()}),
                   os.path.join(args.dir, "dictionary.parquet"), row_group_size=700)
    meta = pa.StructArray.from_arrays([pa.array(docs, pa.string())], names=["text"])
    pq.write_table(pa.table({"meta": meta}), os.path.join(args.dir, "nested.parquet"), compression="zstd",
                   row_group_size=700)
    os.makedirs(os.path.join(args.dir, "shards"), exist_ok=True)
    per = (len(docs) + 3) // 4
    for k in range(4):
        pq.write_table(plain.slice(k * per, per), os.path.join(args.dir, "shards", "part-%05d.parquet" % k),
                       row_group_size=300)


def datasets_folder(args):
    import datasets

    ds = datasets.Dataset.from_json(args.jsonl)
    ds.save_to_disk(args.dir, num_shards=2)
    ds.to_json(args.dir + ".jsonl", lines=True)


def bad(args):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["fine"] * 5 + [None] + ["fine"] * 3
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), os.path.join(args.dir, "nulls.parquet"),
                   row_group_size=4)
    pq.write_table(pa.table({"text": pa.array([1, 2, 3], pa.int64())}), os.path.join(args.dir, "numbers.parquet"))
    invalid = pa.array([b"fine", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": invalid}), os.path.join(args.dir, "utf8.parquet"))
    open(os.path.join(args.dir, "empty.parquet"), "wb").close()
    data = open(os.path.join(args.dir, "snappy.parquet"), "rb").read()
    with open(os.path.join(args.dir, "truncated.parquet"), "wb") as f:
        f.write(data[: len(data) // 2])


def examples(args):
    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    os.makedirs(args.dir, exist_ok=True)
    rng = random.Random(5)
    words = ["hello", "données", "über", "日本語", "🙂", "why", "the", "tokens", "line\nbreak", "a", "Parquet", "?"]

    def text(lo, hi):
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    def write(name, rows, table=None, row_group_size=7):
        with open(os.path.join(args.dir, name + ".jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        table = table if table is not None else pa.Table.from_pylist(rows)
        pq.write_table(table, os.path.join(args.dir, name + ".parquet"), compression="zstd",
                       row_group_size=row_group_size)
        return table

    chats = []
    for i in range(40):
        messages = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": text(2, 6)})
        for turn in range(rng.randint(1, 3)):
            user = {"role": "user", "content": text(1, 12)}
            if i % 4 == 1 and turn == 0:
                user["name"] = "ada"  # the other messages get name: null in the table, as datasets gives them
            messages += [user, {"role": "assistant", "content": text(1, 20)}]
        chats.append({"id": i, "messages": messages})
    table = pa.Table.from_pylist(chats)
    table = table.append_column("source", pa.array([["web", "books"][i % 2] for i in range(40)]).dictionary_encode())
    table = table.append_column("image", pa.array([bytes([i, 0, 255]) for i in range(40)], pa.binary()))
    write("chats", chats, table)
    os.makedirs(os.path.join(args.dir, "chats-shards"), exist_ok=True)
    for k in range(3):
        pq.write_table(table.slice(k * 14, 14), os.path.join(args.dir, "chats-shards", "part-%05d.parquet" % k))
    datasets.Dataset.from_parquet(os.path.join(args.dir, "chats.parquet")).save_to_disk(
        os.path.join(args.dir, "chats-folder"), num_shards=2)

    write("pairs", [{"prompt": text(1, 10), "response": text(1, 10), "score": rng.random()} for _ in range(30)])
    preferences = [{"prompt": [{"role": "user", "content": text(1, 10)}],
                    "chosen": [{"role": "assistant", "content": text(1, 8)}],
                    "rejected": [{"role": "assistant", "content": text(1, 8)}]} for _ in range(24)]
    feather.write_feather(write("preferences", preferences), os.path.join(args.dir, "preferences.arrow"),
                          compression="uncompressed")
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), os.path.join(args.dir, "other.parquet"))

    # Every kind of value a row can hold, and pyarrow's own rows of it (to_pylist; dates as text).
    types = pa.table({
        "messages": pa.array([[{"role": "user", "content": "hi", "name": None}], [], None]),
        "tags": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        "xy": pa.array([[1.5, 2.0], None, [0.25, -1.0]], pa.list_(pa.float32(), 2)),
        "big": pa.array([[1, 2], [3], []], pa.large_list(pa.int16())),
        "ok": pa.array([True, None, False]),
        "n": pa.array([2**40, -3, None], pa.int64()),
        "u": pa.array([255, 0, 7], pa.uint8()),
        "day": pa.array([0, 19000, None], pa.date32()),
        "label": pa.array(["a", "b", "a"]).dictionary_encode(),
        "wide": pa.array(["x", None, "z"], pa.large_string()),
    })
    pq.write_table(types, os.path.join(args.dir, "types.parquet"), row_group_size=2)
    with open(os.path.join(args.dir, "types.jsonl"), "w", encoding="utf-8") as f:
        for r in types.to_pylist():
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")


def shard(args):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(11)
    vocab = open(__file__, encoding="utf-8").read().split() + ["données", "über", "日本語", "naïve"]
    target = args.megabytes * 1_000_000
    writer = None
    written, row = 0, 0
    while written < target:
        texts = []
        for _ in range(10_000):
            texts.append(" ".join(rng.choice(vocab) for _ in range(rng.randint(50, 600))))
        n = len(texts)
        table = pa.table({
            "text": pa.array(texts, pa.string()),
            "id": pa.array(["<urn:uuid:%08d>" % (row + i) for i in range(n)], pa.string()),
            "dump": pa.array(["CC-MAIN-2024-10"] * n, pa.string()),
            "url": pa.array(["https://example.org/%d" % (row + i) for i in range(n)], pa.string()),
            "language_score": pa.array([rng.random() for _ in range(n)], pa.float64()),
        })
        if writer is None:
            writer = pq.ParquetWriter(args.out, table.schema, compression="snappy")
        writer.write_table(table, row_group_size=10_000)
        written += sum(len(t.encode("utf-8")) for t in texts)
        row += n
    writer.close()
    print(json.dumps({"rows": row, "text_bytes": written, "file_bytes": os.path.getsize(args.out)}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("dir")
    c.add_argument("--documents", type=int, default=3000)
    d = sub.add_parser("datasets")
    d.add_argument("dir")
    d.add_argument("jsonl")
    b = sub.add_parser("bad")
    b.add_argument("dir")
    e = sub.add_parser("examples")
    e.add_argument("dir")
    s = sub.add_parser("shard")
    s.add_argument("out")
    s.add_argument("--megabytes", type=int, default=200)
    args = p.parse_args()
    {"corpus": corpus, "datasets": datasets_folder, "bad": bad, "examples": examples, "shard": shard}[args.command](args)


if __name__ == "__main__":
    main()
