#!/usr/bin/env python3
"""Hugging Face transformers as the reference for Tessera's GPT-2 and Llama interop tests.

    hf_reference.py make-gpt2 DIR [--published] [--std S] ...     a tiny random GPT2LMHeadModel
    hf_reference.py make-llama DIR [--kv-heads K] [--max-shard-size 40KB] [--rope-theta T] [--tokenizer] ...
    hf_reference.py make-mixtral DIR [--experts E] [--top-k K] [--kv-heads K] ...   a MixtralForCausalLM
    hf_reference.py make-qwen2 DIR [--window W --max-window-layers L] [--tied] ...   a Qwen2ForCausalLM
    hf_reference.py make-qwen3 DIR [--head-dim D] [--attention-bias] [--window W ...] ...   a Qwen3ForCausalLM
    hf_reference.py make-gemma3 DIR [--window W] [--pattern K] [--rope-factor F] [--final-softcap C] ...
    hf_reference.py make-qwen3-moe DIR [--experts E] [--top-k K] [--dense-blocks 0 ...] [--norm-topk] ...
    hf_reference.py make-deepseek-v3 DIR [--layers L] [--q-lora-rank R] [--yarn] [--skew S] [--mtp] ...
    hf_reference.py tokens FILE --count N --vocab V [--seed S]      uint16 token ids, uniform
    hf_reference.py same-tokenizer DIR_A DIR_B                       both tokenizers encode alike
    hf_reference.py probe-tokens FILE --model DIR --mutate WHAT --seq-len T --windows N
    hf_reference.py loss DIR --tokens FILE --seq-len T --batch B --batches K [--mutate WHAT] [--adapter PEFT_DIR]
    hf_reference.py train DIR --tokens FILE --seq-len T --batch B --world W --steps N --lr LR ...
                      [--optimizer muon --ns-dtype bf16|fp32 --adamw-lr LR --adamw-weight-decay WD ...]

serve.py runs these commands in one process for a test (tests/integration/reference_process.hpp).

Models are built from a config in Python (nothing is downloaded) with weights of realistic
scale: at GPT-2's 0.02 init a model is so close to linear that a wrong GELU variant or RoPE
layout changes the loss by less than the tests' tolerance. `loss` prints one JSON line,
{"loss": mean over target tokens, "tokens": count}, for the first K batches of B windows of the
token file read in order (windows of T + 1 tokens, stride T, as dataset/tokens with shuffle off);
--adapter loads a PEFT adapter folder over the model first (peft.PeftModel.from_pretrained);
--mutate computes it with a deliberate mistake (gelu for gelu_new, another rope_theta,
interleaved instead of rotate-half RoPE, no sliding window) to show the tests would catch it. The GELU variants
differ by at most 5e-4, which averages out of the loss on random tokens; `probe-tokens` writes
text on which it cannot (each next token is the one that mistake moves most). `train` runs a plain
PyTorch loop (AdamW, decay on matrices only, the step loss the summed token loss over the step's
target tokens) and prints each step's loss, one JSON list; with --optimizer muon, torch.optim.Muon
over the hidden matrices (2-D, their names without `embed`, `wte`, `wpe` or `lm_head`) and
torch.optim.AdamW over the rest (--beta1, --beta2, --eps, --adamw-weight-decay, --adamw-lr); with
--ns-dtype fp32 its Newton-Schulz iteration runs in float32 instead of torch's bfloat16.
"""
import argparse
import json
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F


def realistic_(model, std, seed):
    """Weights normal(0, std), the MLP's output projection normal(0, std / 3); norms' gains
    around 1; biases small but non-zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            module = name.split(".")[-2]
            if "ln" in module or "norm" in module:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.c_proj.weight") or name.endswith("mlp.down_proj.weight"):
                p.copy_(std / 3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))


def make_gpt2(args):
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=args.vocab, n_positions=args.positions, n_embd=args.embd, n_layer=args.layers,
                        n_head=args.heads, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    realistic_(model, args.std, args.seed)
    out = pathlib.Path(args.dir)
    model.save_pretrained(out, safe_serialization=True)
    if args.published:
        # As the files on the Hub are: names without "transformer.", no lm_head, and the causal
        # mask buffers attn.bias / attn.masked_bias with every layer.
        state = {k[len("transformer."):]: v.contiguous() for k, v in model.state_dict().items()
                 if k.startswith("transformer.")}
        P = args.positions
        for i in range(args.layers):
            state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(P, P, dtype=torch.uint8)).view(1, 1, P, P)
            state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def make_llama(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope_scaling = None
    if args.llama3_scaling:
        rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16}
    kwargs = dict(vocab_size=args.vocab, hidden_size=args.embd, intermediate_size=args.intermediate,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                  max_position_embeddings=args.positions, rms_norm_eps=1e-5,
                  tie_word_embeddings=args.tied)
    try:  # transformers >= 5 takes the RoPE settings as rope_parameters
        params = {"rope_type": "default", "rope_theta": args.rope_theta}
        if rope_scaling:
            params = dict(rope_scaling, rope_theta=args.rope_theta)
        config = LlamaConfig(rope_parameters=params, **kwargs)
        assert abs(_rope_theta(config) - args.rope_theta) < 1e-9
    except (TypeError, AssertionError, KeyError):
        config = LlamaConfig(rope_theta=args.rope_theta, rope_scaling=rope_scaling, **kwargs)
    model = LlamaForCausalLM(config)
    realistic_(model, args.std, args.seed)
    model.save_pretrained(args.dir, safe_serialization=True, max_shard_size=args.max_shard_size)
    if args.tokenizer:
        save_tokenizer(args.dir, args.vocab)


def make_mixtral(args):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=args.vocab, hidden_size=args.embd, intermediate_size=args.intermediate,
                           num_hidden_layers=args.layers, num_attention_heads=args.heads,
                           num_key_value_heads=args.kv_heads, max_position_embeddings=args.positions,
                           rms_norm_eps=1e-5, num_local_experts=args.experts, num_experts_per_tok=args.top_k,
                           router_aux_loss_coef=0.02, sliding_window=None, tie_word_embeddings=False)
    model = MixtralForCausalLM(config)
    realistic_(model, args.std, args.seed)
    model.save_pretrained(args.dir, safe_serialization=True)


def make_qwen(args):
    """Qwen2 (q/k/v biases) or Qwen3 (per-head q/k norms, head_dim of its own, attention_bias),
    with a sliding window on the blocks from --max-window-layers on when --window is given."""
    import transformers

    qwen3 = args.command == "make-qwen3"
    kwargs = dict(vocab_size=args.vocab, hidden_size=args.embd, intermediate_size=args.intermediate,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                  max_position_embeddings=args.positions, rms_norm_eps=1e-6, tie_word_embeddings=args.tied,
                  rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
                  use_sliding_window=args.window > 0, sliding_window=args.window or None,
                  max_window_layers=args.max_window_layers)
    if qwen3:
        config = transformers.Qwen3Config(head_dim=args.head_dim, attention_bias=args.attention_bias, **kwargs)
        model = transformers.Qwen3ForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**kwargs)
        model = transformers.Qwen2ForCausalLM(config)
    # The sliding window needs an attention that honours it (sdpa does, with transformers' masks).
    model.config._attn_implementation = "sdpa"
    realistic_(model, args.std, args.seed)
    model.save_pretrained(args.dir, safe_serialization=True, max_shard_size=args.max_shard_size)


def make_gemma3(args):
    """Gemma3ForCausalLM: sliding layers (every --pattern-th one global) attending within --window,
    two rotary bases (the global one scaled linearly by --rope-factor), (1 + weight) norms
    perturbed around their identity, Gemma 2's --attn-softcap and --final-softcap where given."""
    import transformers

    full = {"rope_type": "default", "rope_theta": 1000000.0}
    if args.rope_factor != 1.0:
        full = {"rope_type": "linear", "factor": args.rope_factor, "rope_theta": 1000000.0}
    config = transformers.Gemma3TextConfig(
        vocab_size=args.vocab, hidden_size=args.embd, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, max_position_embeddings=args.positions, sliding_window=args.window,
        layer_types=["full_attention" if (i + 1) % args.pattern == 0 else "sliding_attention" for i in range(args.layers)],
        rope_parameters={"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        query_pre_attn_scalar=args.query_pre_attn_scalar, attn_logit_softcapping=args.attn_softcap or None,
        final_logit_softcapping=args.final_softcap or None, tie_word_embeddings=True)
    model = transformers.Gemma3ForCausalLM(config)
    model.config._attn_implementation = "eager" if args.attn_softcap else "sdpa"  # sdpa cannot softcap
    realistic_(model, args.std, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    model.save_pretrained(args.dir, safe_serialization=True)


def make_qwen3_moe(args):
    """Qwen3-MoE: Qwen3's attention, experts of their own width in the blocks that route
    (decoder_sparse_step, mlp_only_layers), the others a dense SwiGLU of intermediate_size."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=args.vocab, hidden_size=args.embd, intermediate_size=args.intermediate,
                            moe_intermediate_size=args.expert_intermediate, num_hidden_layers=args.layers,
                            num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                            max_position_embeddings=args.positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
                            num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=args.norm_topk,
                            decoder_sparse_step=args.sparse_step, mlp_only_layers=args.dense_blocks,
                            router_aux_loss_coef=0.001, attention_bias=args.attention_bias)
    model = Qwen3MoeForCausalLM(config)
    realistic_(model, args.std, args.seed)
    model.save_pretrained(args.dir, safe_serialization=True)


def make_deepseek_v3(args):
    """DeepSeek-V3: multi-head latent attention (YaRN with mscale_all_dim when --yarn), a dense
    first block, then shared and routed experts in groups; the routing correction bias perturbed
    like the norms. --skew S skews the routers towards expert 0 (for
    the balancing benchmark: expert 0's gate row along the mean input of its block, S times a
    row's norm); --mtp stores a multi-token-prediction layer as the Hub's files do."""
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if args.yarn:
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    config = DeepseekV3Config(vocab_size=args.vocab, hidden_size=args.embd, intermediate_size=args.intermediate,
                              moe_intermediate_size=args.expert_intermediate, num_hidden_layers=args.layers,
                              num_attention_heads=args.heads, num_key_value_heads=args.heads,
                              n_shared_experts=args.shared, n_routed_experts=args.experts,
                              num_experts_per_tok=args.top_k, routed_scaling_factor=2.5, n_group=args.groups,
                              topk_group=args.groups_kept, first_k_dense_replace=1, norm_topk_prob=True,
                              q_lora_rank=args.q_lora_rank or None, kv_lora_rank=32, qk_rope_head_dim=8,
                              qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=args.positions,
                              rms_norm_eps=1e-6, rope_parameters=rope, rope_interleave=True,
                              tie_word_embeddings=False)
    model = DeepseekV3ForCausalLM(config)
    realistic_(model, args.std, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=g))
    if args.skew:
        # A skewed router: every routed block's gate row of expert 0 pointed along the mean of what
        # reaches that block's experts on random tokens, so that most tokens prefer expert 0.
        seen = {}
        hooks = [layer.mlp.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].mean((0, 1))))
                 for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
        with torch.no_grad():
            model(torch.randint(0, args.vocab, (4, 32), generator=g))
            for h in hooks:
                h.remove()
            for i, mean in seen.items():
                gate = model.model.layers[i].mlp.gate.weight
                gate[0] += args.skew * mean / mean.norm() * gate.norm(dim=1).mean()
    model.save_pretrained(args.dir, safe_serialization=True)
    if args.mtp:
        # The Hub's DeepSeek-V3 stores its MTP module as one more layer, which transformers skips.
        path = pathlib.Path(args.dir) / "model.safetensors"
        tensors = load_file(str(path))
        n = args.layers
        for name in [k for k in tensors if k.startswith("model.layers.1.")]:
            tensors[name.replace("model.layers.1.", f"model.layers.{n}.")] = tensors[name].clone()
        tensors[f"model.layers.{n}.eh_proj.weight"] = torch.zeros(args.embd, 2 * args.embd)
        save_file(tensors, str(path), metadata={"format": "pt"})


def save_tokenizer(folder, vocab):
    """A byte-level BPE tokenizer of `vocab` ids trained on a few sentences, saved the way
    transformers saves one (tokenizer.json, tokenizer_config.json, ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the quick brown fox jumps over the lazy dog", "a model trained in one framework is read by another"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(folder)


def same_tokenizer(args):
    """Exit 1 unless both folders' tokenizers (as transformers loads them) encode alike."""
    from transformers import AutoTokenizer

    text = "the lazy fox is read by another framework"
    a, b = (AutoTokenizer.from_pretrained(f).encode(text) for f in (args.first, args.second))
    if a != b:
        sys.exit(f"{args.first} encodes {a}, {args.second} encodes {b}")
    print(json.dumps({"ids": a}))


def _rope_theta(config):
    params = getattr(config, "rope_parameters", None)
    if params and "rope_theta" in params:
        return params["rope_theta"]
    return config.rope_theta


def write_tokens(args):
    rng = np.random.default_rng(args.seed)
    rng.integers(0, args.vocab, size=args.count, dtype=np.uint16).tofile(args.file)


def probe_tokens(args):
    """Windows of seq_len + 1 tokens (consecutive windows share a token, as dataset/tokens reads
    them) in which each next token is the one whose logit the mutated model moves most against
    the reference: data on which that mistake cannot average out of the loss."""
    ref, mutated = load(args.model), load(args.model, args.mutate)
    ref.eval(), mutated.eval()
    g = torch.Generator().manual_seed(args.seed)
    ids = [int(torch.randint(0, ref.config.vocab_size, (1,), generator=g))]
    with torch.no_grad():
        for _ in range(args.windows):
            window = [ids[-1]]
            for _ in range(args.seq_len):
                x = torch.tensor([window])
                shift = ref(input_ids=x).logits[0, -1] - mutated(input_ids=x).logits[0, -1]
                window.append(int(shift.argmax()))  # one sign throughout: no cancelling
            ids.extend(window[1:])
    np.array(ids, dtype=np.uint16).tofile(args.file)


def windows(path, seq_len, start, count):
    """Samples start .. start+count-1 of dataset/tokens with shuffle off: (inputs, labels)."""
    ids = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
    rows = torch.stack([ids[(start + i) * seq_len:(start + i) * seq_len + seq_len + 1] for i in range(count)])
    return rows[:, :-1], rows[:, 1:]


def load(folder, mutate=None, strict=False):
    """The folder as transformers loads it; `strict`: exit 1 when transformers reports a missing,
    unexpected or misshapen tensor (what it would warn about)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if mutate == "gelu":
        config.activation_function = "gelu"
    elif mutate == "theta":
        if getattr(config, "rope_parameters", None) and "rope_theta" in config.rope_parameters:
            config.rope_parameters["rope_theta"] = 10000.0
        config.rope_theta = 10000.0
    elif mutate == "final-softcap":
        config.final_logit_softcapping = None
    elif mutate == "window":
        if config.model_type != "gemma3_text":  # Gemma's masks need a window even when no layer slides
            config.sliding_window = None
        config.use_sliding_window = False
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    # sdpa cannot cap attention scores: Gemma 2's softcap needs the eager attention.
    attention = "eager" if getattr(config, "attn_logit_softcapping", None) else None
    model, info = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32,
                                                       output_loading_info=True, attn_implementation=attention)
    problems = {k: sorted(v) for k, v in info.items() if v}
    if strict and problems:
        sys.exit(f"{folder}: transformers reports {problems}")
    if mutate == "interleaved":
        interleave_rope()
    return model


def interleave_rope():
    """Llama's RoPE with adjacent pairs (x0, x1), (x2, x3), ... rotated: Meta's original layout."""
    import transformers.models.llama.modeling_llama as llama

    def rotate(x):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)

    def apply(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        half = cos.shape[-1] // 2  # the tables hold each frequency twice: [f, f]; make it f0 f0 f1 f1 ...
        cos = cos[..., :half].repeat_interleave(2, dim=-1)
        sin = sin[..., :half].repeat_interleave(2, dim=-1)
        return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin

    llama.apply_rotary_pos_emb = apply


def mean_loss(model, inputs, labels):
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum"), labels.numel()


def loss(args):
    model = load(args.dir, args.mutate, args.strict)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(args.batches):
            inputs, labels = windows(args.tokens, args.seq_len, b * args.batch, args.batch)
            s, n = mean_loss(model, inputs, labels)
            total += float(s.double())
            count += n
    print(json.dumps({"loss": total / count, "tokens": count}))


def newton_schulz_fp32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's Newton-Schulz iteration, in float32 instead of bfloat16."""
    a, b, c = ns_coefficients
    x = grad.float().clone()
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def optimizers(model, args):
    if args.optimizer == "adamw":
        decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
        return [torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)]
    import torch.optim._muon as muon
    # One process serves several commands (serve.py): torch's own iteration is kept to go back to.
    if not hasattr(muon, "bf16_newton_schulz"):
        muon.bf16_newton_schulz = muon._zeropower_via_newtonschulz
    muon._zeropower_via_newtonschulz = newton_schulz_fp32 if args.ns_dtype == "fp32" else muon.bf16_newton_schulz
    adamw_names = ("embed", "wte", "wpe", "lm_head")
    hidden = lambda n, p: p.dim() == 2 and not any(s in n for s in adamw_names)  # noqa: E731
    matrices = [p for n, p in model.named_parameters() if hidden(n, p)]
    rest = [p for n, p in model.named_parameters() if not hidden(n, p)]
    return [torch.optim.Muon(matrices, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
                             nesterov=True, adjust_lr_fn=args.adjust_lr_fn),
            torch.optim.AdamW(rest, lr=args.adamw_lr or args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                              weight_decay=args.adamw_weight_decay)]


def train(args):
    torch.manual_seed(0)
    model = load(args.dir)
    model.train()
    opts = optimizers(model, args)
    per_step = args.batch * args.world  # the step's samples over all ranks, in order
    losses = []
    for step in range(args.steps):
        inputs, labels = windows(args.tokens, args.seq_len, step * per_step, per_step)
        for opt in opts:
            opt.zero_grad()
        s, n = mean_loss(model, inputs, labels)
        (s / n).backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for opt in opts:
            opt.step()
        losses.append(float(s) / n)
    print(json.dumps(losses))


def generate(args):
    """Greedy completions of each prompt alone (no padding): transformers' generate with its cache."""
    model = load(args.dir)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    out = []
    with torch.no_grad():
        for prompt in json.loads(args.prompts):
            ids = torch.tensor([prompt], dtype=torch.long)
            tokens = model.generate(ids, do_sample=False, max_new_tokens=args.max_new, min_new_tokens=args.max_new,
                                    eos_token_id=None, pad_token_id=0)
            out.append(tokens[0, len(prompt):].tolist())
    print(json.dumps(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("make-gpt2")
    g.add_argument("dir")
    g.add_argument("--vocab", type=int, default=256)
    g.add_argument("--positions", type=int, default=64)
    g.add_argument("--embd", type=int, default=64)
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--std", type=float, default=0.3)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--published", action="store_true", help="write the weights as published GPT-2 files are")
    g.set_defaults(fn=make_gpt2)

    m = sub.add_parser("make-llama")
    m.add_argument("dir")
    m.add_argument("--vocab", type=int, default=256)
    m.add_argument("--positions", type=int, default=64)
    m.add_argument("--embd", type=int, default=64)
    m.add_argument("--intermediate", type=int, default=128)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--rope-theta", type=float, default=500000.0)
    m.add_argument("--llama3-scaling", action="store_true")
    m.add_argument("--tied", action="store_true")
    m.add_argument("--std", type=float, default=0.3)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--max-shard-size", default="5GB")
    m.add_argument("--tokenizer", action="store_true", help="also save a small BPE tokenizer in the folder")
    m.set_defaults(fn=make_llama)

    x = sub.add_parser("make-mixtral")
    x.add_argument("dir")
    x.add_argument("--vocab", type=int, default=256)
    x.add_argument("--positions", type=int, default=64)
    x.add_argument("--embd", type=int, default=64)
    x.add_argument("--intermediate", type=int, default=64)
    x.add_argument("--layers", type=int, default=2)
    x.add_argument("--heads", type=int, default=4)
    x.add_argument("--kv-heads", type=int, default=2)
    x.add_argument("--experts", type=int, default=4)
    x.add_argument("--top-k", type=int, default=2)
    x.add_argument("--std", type=float, default=0.3)
    x.add_argument("--seed", type=int, default=0)
    x.set_defaults(fn=make_mixtral)

    for name in ("make-qwen2", "make-qwen3"):
        q = sub.add_parser(name)
        q.add_argument("dir")
        q.add_argument("--vocab", type=int, default=256)
        q.add_argument("--positions", type=int, default=64)
        q.add_argument("--embd", type=int, default=64)
        q.add_argument("--intermediate", type=int, default=128)
        q.add_argument("--layers", type=int, default=2)
        q.add_argument("--heads", type=int, default=4)
        q.add_argument("--kv-heads", type=int, default=2)
        q.add_argument("--head-dim", type=int, default=24, help="Qwen3's, apart from embd / heads")
        q.add_argument("--attention-bias", action="store_true", help="Qwen3's q/k/v and o_proj biases")
        q.add_argument("--rope-theta", type=float, default=1000000.0)
        q.add_argument("--window", type=int, default=0, help="sliding window (0: none)")
        q.add_argument("--max-window-layers", type=int, default=0)
        q.add_argument("--tied", action="store_true")
        q.add_argument("--std", type=float, default=0.3)
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--max-shard-size", default="5GB")
        q.set_defaults(fn=make_qwen)

    ge = sub.add_parser("make-gemma3")
    ge.add_argument("dir")
    for flag, default in (("--vocab", 256), ("--positions", 64), ("--embd", 64), ("--intermediate", 128),
                          ("--layers", 4), ("--heads", 4), ("--kv-heads", 2), ("--head-dim", 16), ("--window", 8),
                          ("--pattern", 2), ("--query-pre-attn-scalar", 24), ("--seed", 0)):
        ge.add_argument(flag, type=int, default=default)
    for flag, default in (("--rope-factor", 1.0), ("--attn-softcap", 0.0), ("--final-softcap", 0.0), ("--std", 0.1)):
        ge.add_argument(flag, type=float, default=default)
    ge.set_defaults(fn=make_gemma3)

    qm = sub.add_parser("make-qwen3-moe")
    qm.add_argument("dir")
    qm.add_argument("--vocab", type=int, default=256)
    qm.add_argument("--positions", type=int, default=64)
    qm.add_argument("--embd", type=int, default=64)
    qm.add_argument("--intermediate", type=int, default=128, help="the dense blocks' MLP width")
    qm.add_argument("--expert-intermediate", type=int, default=48)
    qm.add_argument("--layers", type=int, default=3)
    qm.add_argument("--heads", type=int, default=4)
    qm.add_argument("--kv-heads", type=int, default=2)
    qm.add_argument("--head-dim", type=int, default=24)
    qm.add_argument("--rope-theta", type=float, default=1000000.0)
    qm.add_argument("--experts", type=int, default=4)
    qm.add_argument("--top-k", type=int, default=2)
    qm.add_argument("--norm-topk", action="store_true", help="norm_topk_prob: the k gates divided by their sum")
    qm.add_argument("--sparse-step", type=int, default=1)
    qm.add_argument("--dense-blocks", type=int, nargs="*", default=[])
    qm.add_argument("--attention-bias", action="store_true")
    qm.add_argument("--std", type=float, default=0.3)
    qm.add_argument("--seed", type=int, default=0)
    qm.set_defaults(fn=make_qwen3_moe)

    ds = sub.add_parser("make-deepseek-v3")
    ds.add_argument("dir")
    ds.add_argument("--vocab", type=int, default=256)
    ds.add_argument("--positions", type=int, default=64)
    ds.add_argument("--embd", type=int, default=64)
    ds.add_argument("--intermediate", type=int, default=128)
    ds.add_argument("--expert-intermediate", type=int, default=32)
    ds.add_argument("--layers", type=int, default=3)
    ds.add_argument("--heads", type=int, default=4)
    ds.add_argument("--experts", type=int, default=8)
    ds.add_argument("--top-k", type=int, default=2)
    ds.add_argument("--groups", type=int, default=4)
    ds.add_argument("--groups-kept", type=int, default=2)
    ds.add_argument("--shared", type=int, default=1)
    ds.add_argument("--q-lora-rank", type=int, default=24)
    ds.add_argument("--yarn", action="store_true")
    ds.add_argument("--skew", type=float, default=0.0)
    ds.add_argument("--mtp", action="store_true")
    ds.add_argument("--std", type=float, default=0.3)
    ds.add_argument("--seed", type=int, default=0)
    ds.set_defaults(fn=make_deepseek_v3)

    t = sub.add_parser("tokens")
    t.add_argument("file")
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(fn=write_tokens)

    st = sub.add_parser("same-tokenizer")
    st.add_argument("first")
    st.add_argument("second")
    st.set_defaults(fn=same_tokenizer)

    pt = sub.add_parser("probe-tokens")
    pt.add_argument("file")
    pt.add_argument("--model", required=True)
    pt.add_argument("--mutate", choices=["gelu", "theta", "interleaved"], required=True)
    pt.add_argument("--seq-len", type=int, required=True)
    pt.add_argument("--windows", type=int, required=True)
    pt.add_argument("--seed", type=int, default=0)
    pt.set_defaults(fn=probe_tokens)

    gen = sub.add_parser("generate")
    gen.add_argument("dir")
    gen.add_argument("--prompts", required=True, help="a JSON list of token id lists")
    gen.add_argument("--max-new", type=int, required=True)
    gen.add_argument("--adapter", help="a PEFT adapter folder loaded over the model")
    gen.set_defaults(fn=generate)

    for name, fn in (("loss", loss), ("train", train)):
        c = sub.add_parser(name)
        c.add_argument("dir")
        c.add_argument("--tokens", required=True)
        c.add_argument("--seq-len", type=int, required=True)
        c.add_argument("--batch", type=int, required=True)
        c.set_defaults(fn=fn)
        if name == "loss":
            c.add_argument("--batches", type=int, required=True)
            c.add_argument("--mutate", choices=["gelu", "theta", "interleaved", "window", "final-softcap"])
            c.add_argument("--strict", action="store_true",
                           help="fail when transformers reports missing, unexpected or misshapen tensors")
            c.add_argument("--adapter", help="a PEFT adapter folder loaded over the model")
        else:
            c.add_argument("--world", type=int, default=1)
            c.add_argument("--steps", type=int, required=True)
            c.add_argument("--lr", type=float, required=True)
            c.add_argument("--beta1", type=float, default=0.9)
            c.add_argument("--beta2", type=float, default=0.95)
            c.add_argument("--eps", type=float, default=1e-8)
            c.add_argument("--weight-decay", type=float, default=0.0)
            c.add_argument("--clip", type=float, default=0.0)
            c.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw")
            c.add_argument("--momentum", type=float, default=0.95)
            c.add_argument("--ns-dtype", choices=["bf16", "fp32"], default="bf16")
            c.add_argument("--adjust-lr-fn", choices=["original", "match_rms_adamw"], default="original")
            c.add_argument("--adamw-lr", type=float)
            c.add_argument("--adamw-weight-decay", type=float, default=0.01)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
