"""Writes the seed corpora of tools/fuzz that come from the Python ecosystem (run once; the
files are kept in the tree): safetensors files saved by the safetensors package, and small
tokenizer.json files trained by Hugging Face tokenizers in GPT-2 and Llama-3 styles.

    .venv/bin/python tools/fuzz/make_seeds.py
"""
import json
import pathlib

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

here = pathlib.Path(__file__).parent / "corpus"

st = here / "safetensors_fuzzer"
save_file({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
          str(st / "two_tensors.safetensors"), metadata={"format": "pt"})
save_file({"ids": torch.arange(5, dtype=torch.int64), "scalar": torch.tensor(1.5)}, str(st / "ints.safetensors"))
save_file({"empty": torch.zeros(0, 3, dtype=torch.float16)}, str(st / "empty_tensor.safetensors"))

text = ["Hello, world! The quick brown fox jumps over the lazy dog.", "Numbers 123 4567 and café, naïve.",
        "It's a test: isn't it?  Spaces\tand\nnewlines."] * 20
tk = here / "tokenizer_json_fuzzer"
gpt2 = Tokenizer(models.BPE())
gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
gpt2.decoder = decoders.ByteLevel()
gpt2.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
gpt2.save(str(tk / "gpt2_style.json"))

llama = Tokenizer(models.BPE(ignore_merges=True))
llama.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
                         behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
llama.decoder = decoders.ByteLevel()
llama.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
llama.save(str(tk / "llama3_style.json"))

ti = here / "token_index_fuzzer"
(ti / "prepared.json").write_text(json.dumps({
    "format": "tessera-tokens", "dtype": "uint16", "documents": 12, "tokens": 2048, "eos_id": 0,
    "tokenizer": {"identity": "bpe:tokenizer.json:crc32c=1234abcd", "vocab_size": 300},
    "sources": [{"path": "data.jsonl", "bytes": 4096, "crc32c": 305419896}]}, indent=1))

# vocab_merges_fuzzer: GPT-2's two files in one input, split at a line "#merges".
vm = here / "vocab_merges_fuzzer"
vm.mkdir(exist_ok=True)
gpt2_json = json.loads((tk / "gpt2_style.json").read_text())
merges = [" ".join(m) if isinstance(m, list) else m for m in gpt2_json["model"]["merges"]]
(vm / "gpt2_style.txt").write_text(json.dumps(gpt2_json["model"]["vocab"], ensure_ascii=False) +
                                   "\n#merges\n#version: 0.2\n" + "\n".join(merges) + "\n")

# Parquet and Arrow IPC files written by pyarrow (parquet_fuzzer): plain, dictionary-encoded,
# large-string and nested text columns, several row groups and codecs, and the IPC stream and
# file formats that `datasets` folders hold.
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

pf = here / "parquet_fuzzer"
pf.mkdir(exist_ok=True)
texts = ["Hello, world!", "café naïve 日本語", "", "line\nbreak"]
plain = pa.table({"id": pa.array(range(4), pa.int64()), "text": pa.array(texts, pa.string())})
pq.write_table(plain, str(pf / "snappy.parquet"), row_group_size=2)
pq.write_table(plain, str(pf / "plain_uncompressed.parquet"), compression="none", use_dictionary=False)
pq.write_table(pa.table({"text": pa.array(texts, pa.string()).dictionary_encode()}), str(pf / "dictionary.parquet"),
               compression="zstd")
pq.write_table(pa.table({"text": pa.array(texts, pa.large_string())}), str(pf / "large.parquet"), compression="gzip")
pq.write_table(pa.table({"meta": pa.StructArray.from_arrays([pa.array(texts, pa.string())], names=["text"])}),
               str(pf / "nested.parquet"))
with ipc.new_stream(str(pf / "stream.arrow"), plain.schema) as w:
    w.write_table(plain, max_chunksize=2)
with ipc.new_file(str(pf / "file.arrow"), plain.schema) as w:
    w.write_table(plain)
# Rows as the fine-tuning datasets read them: chats (list<struct>), a map, a fixed-size list, a
# dictionary column, floats, booleans, nulls and a date (read as text), in Parquet and Arrow IPC.
chats = [[{"role": "user", "content": t, "name": None}, {"role": "assistant", "content": t[::-1], "name": "ada"}]
         for t in texts]
rows = pa.table({
    "messages": pa.array(chats),
    "text": pa.array(texts, pa.string()).dictionary_encode(),
    "tags": pa.array([[("k", 1)], [], None, [("a", 2), ("b", 3)]], pa.map_(pa.string(), pa.int64())),
    "xy": pa.array([[1.5, 2.0], [0.0, -1.0], None, [3.0, 4.0]], pa.list_(pa.float32(), 2)),
    "ok": pa.array([True, False, None, True]),
    "day": pa.array([0, 1, 2, None], pa.date32()),
})
pq.write_table(rows, str(pf / "rows.parquet"), row_group_size=3)
with ipc.new_stream(str(pf / "rows.arrow"), rows.schema) as w:
    w.write_table(rows, max_chunksize=3)
