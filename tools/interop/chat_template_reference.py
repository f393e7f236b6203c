#!/usr/bin/env python3
"""What transformers makes of chat templates: the reference Tessera's Jinja interpreter and chat
rendering are tested against (tests/integration/chat_template_test.cpp).

    chat_template_reference.py jinja CASES.json OUT.json
        CASES: [{"template": str, "context": {...}}, ...]. Each is rendered by transformers' own
        Jinja environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop
        controls, {% generation %}, tojson, raise_exception, strftime_now, namespace, dict).
        OUT: [{"text": str, "generation": [[begin, end], ...]} | {"error": str}, ...], spans in
        UTF-8 bytes.

    chat_template_reference.py chat TOKENIZER_DIR CASES.json OUT.json
        CASES: [{"messages": [...], "tools": [...]?, "add_generation_prompt": bool, "extra": {...}}].
        OUT: [{"text", "ids", "assistant_masks"?}, ...] from the folder's tokenizer's
        apply_chat_template (assistant_masks where the template has generation blocks).

    chat_template_reference.py sft-loss MODEL_DIR TOKENIZER_DIR CHATS.jsonl
        Prints {"loss", "targets"}: the model's cross-entropy (fp32) over the tokens
        apply_chat_template(return_assistant_tokens_mask=True) marks, summed over every chat of
        the JSON lines ({"messages": [...]}) and divided by their count.

    chat_template_reference.py published CASES.json OUT.json
        CASES: {"templates": {name: source}, "special_tokens": {...}, "conversations": [{"messages",
        "tools"?, "add_generation_prompt", "extra"}]}. Every template renders every conversation
        through transformers' render_jinja_template, as apply_chat_template(tokenize=False) calls
        it with the tokenizer's special tokens. OUT: {name: [{"text"} | {"error"}, ...]}.

    chat_template_reference.py make-tokenizer TEMPLATE OUT_DIR
        A small byte-level BPE tokenizer folder (tokenizer.json, tokenizer_config.json with the
        template, special tokens of the model families as added tokens) for the chat cases.
"""
import json
import sys


def byte_span(text, begin, end):
    return [len(text[:begin].encode("utf-8")), len(text[:end].encode("utf-8"))]


def render_jinja(cases_path, out_path):
    from transformers.utils.chat_template_utils import _compile_jinja_template

    cases = json.load(open(cases_path, encoding="utf-8"))
    out = []
    for case in cases:
        try:
            compiled = _compile_jinja_template(case["template"])
            blocks, spans = [], []
            with compiled.environment.activate_tracker(blocks, spans):
                for block in compiled.generate(**case["context"]):
                    blocks.append(block)
            text = "".join(blocks)
            out.append({"text": text, "generation": [byte_span(text, b, e) for b, e in spans]})
        except Exception as e:  # the case expects an error; its kind is what is compared
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, open(out_path, "w", encoding="utf-8"), ensure_ascii=False)


def render_chats(folder, cases_path, out_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    cases = json.load(open(cases_path, encoding="utf-8"))
    out = []
    for case in cases:
        kwargs = dict(case.get("extra", {}))
        if "tools" in case:
            kwargs["tools"] = case["tools"]
        gen = case.get("add_generation_prompt", False)
        text = tok.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=gen, **kwargs)
        result = {"text": text}
        encoded = tok.apply_chat_template(
            case["messages"], tokenize=True, return_dict=True, add_generation_prompt=gen,
            return_assistant_tokens_mask="{% generation %}" in tok.chat_template, **kwargs)
        result["ids"] = list(encoded["input_ids"])
        if "assistant_masks" in encoded:
            result["assistant_masks"] = list(encoded["assistant_masks"])
        out.append(result)
    json.dump(out, open(out_path, "w", encoding="utf-8"), ensure_ascii=False)


def render_published(cases_path, out_path):
    from transformers.utils.chat_template_utils import render_jinja_template

    cases = json.load(open(cases_path, encoding="utf-8"))
    out = {}
    for name, source in cases["templates"].items():
        results = []
        for conv in cases["conversations"]:
            kwargs = {**cases["special_tokens"], **conv.get("extra", {})}
            try:
                texts, _ = render_jinja_template(
                    conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=source,
                    add_generation_prompt=conv["add_generation_prompt"], **kwargs)
                results.append({"text": texts[0]})
            except Exception as e:  # refused: Tessera must refuse too
                results.append({"error": f"{type(e).__name__}: {e}"})
        out[name] = results
    json.dump(out, open(out_path, "w", encoding="utf-8"), ensure_ascii=False)


def sft_loss(model_dir, tok_dir, chats_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    total, count = 0.0, 0
    with torch.no_grad():
        for line in open(chats_path, encoding="utf-8"):
            if not line.strip():
                continue
            row = json.loads(line)
            enc = tok.apply_chat_template(row["messages"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            ids = torch.tensor([enc["input_ids"]])
            mask = torch.tensor(enc["assistant_masks"], dtype=torch.bool)
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            nll = -logp.gather(1, ids[0, 1:, None])[:, 0]
            total += float(nll[mask[1:]].double().sum())
            count += int(mask[1:].sum())
    print(json.dumps({"loss": total / count, "targets": count}))


SPECIAL_TOKENS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|eom_id|>", "<|python_tag|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>", "<s>", "</s>", "[INST]",
    "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
    "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>",
]


def make_tokenizer(template_path, out_dir):
    """A byte-level BPE trained on a little chat-like text, with the families' special tokens."""
    import os
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    os.makedirs(out_dir, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["You are a helpful assistant. What is the weather in Paris today?",
              "The answer is 42. Let me think step by step about the question.",
              "system user assistant tool function arguments name description parameters"] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIAL_TOKENS)
    tok.train_from_iterator(corpus, trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    template = open(template_path, encoding="utf-8").read()
    names = os.path.basename(template_path)
    bos, eos = ("<|begin_of_text|>", "<|eot_id|>") if "llama" in names else \
        ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>") if "deepseek" in names else \
        ("<bos>", "<eos>") if "gemma" in names else ("<s>", "</s>") if "mistral" in names else \
        (None, "<|im_end|>")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": eos,
              "chat_template": template}
    if bos:
        config["bos_token"] = bos
    json.dump(config, open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8"),
              ensure_ascii=False, indent=1)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "jinja":
        render_jinja(sys.argv[2], sys.argv[3])
    elif command == "chat":
        render_chats(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "published":
        render_published(sys.argv[2], sys.argv[3])
    elif command == "sft-loss":
        sft_loss(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "make-tokenizer":
        make_tokenizer(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {command}")
