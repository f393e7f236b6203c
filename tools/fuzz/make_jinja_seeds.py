#!/usr/bin/env python3
"""Writes jinja_fuzzer's seeds (run again when tests/fixtures/chat_templates changes; the files
are kept in the tree): every chat template there, alone, and followed by a NUL byte and one
conversation of tests/fixtures/chat_templates/conversations.json as the structure-aware mode reads
it ({"messages", "tools", "add_generation_prompt", "extra"}), a different kind for each template.

    python3 tools/fuzz/make_jinja_seeds.py
"""
import json
import pathlib

root = pathlib.Path(__file__).resolve().parents[2]
fixtures = root / "tests" / "fixtures" / "chat_templates"
out = pathlib.Path(__file__).parent / "corpus" / "jinja_fuzzer"
conversations = json.loads((fixtures / "conversations.json").read_text(encoding="utf-8"))
templates = sorted(fixtures.glob("*.jinja")) + sorted((fixtures / "published").glob("*.jinja"))
for i, path in enumerate(templates):
    source = path.read_bytes()
    (out / path.name).write_bytes(source)
    c = conversations[i % len(conversations)]
    conversation = {k: c[k] for k in ("messages", "tools", "add_generation_prompt", "extra") if k in c}
    (out / (path.stem + ".conversation")).write_bytes(source + b"\0" + json.dumps(conversation).encode("utf-8"))
print(f"{len(templates)} templates, each alone and with a conversation, in {out}")
