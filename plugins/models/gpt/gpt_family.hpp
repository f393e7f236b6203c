// The GPT-2 family as a family spec over the SDK's kit, shared by model/gpt and model/gpt_moe
// (both built from this folder): learned positions, pre-norm blocks of LayerNorm -> fused q|k|v
// attention -> LayerNorm -> a 4x GELU MLP or, every moe_every-th block of gpt_moe, GELU experts,
// a final LayerNorm and the token embedding again as the head. Parameter names are GPT-2's (wte,
// wpe, h.N.ln_1, h.N.attn.c_attn, ..., ln_f), so Hugging Face's GPT2LMHeadModel maps onto them
// under `transformer.` (its Conv1D weights stored [in, out]). config.json is the table below.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/decoder_factory.hpp"
#include "tessera/nn/decoder_fields.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/family.hpp"
#include "tessera/nn/hf_fields.hpp"
#include "tessera/nn/mesh_rules.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::gpt_family {

// The kit's decoder and routing fields, GPT-2's biases and GELU; gpt_moe's experts (a gpt has
// none: num_experts 0).
struct GptConfig : nn::DecoderFields, nn::MoeFields {
  bool bias = true;
  std::string activation = "gelu";
  std::int64_t expert_hidden = 0;  // 0: 4 x n_embd
  std::int64_t moe_every = 1;
  std::string init_from;
  std::set<std::string> given;

  GptConfig() { num_experts = 0; }
  bool moe() const { return num_experts > 0; }
  std::int64_t expert_width() const { return expert_hidden > 0 ? expert_hidden : 4 * n_embd; }
  // Every moe_every-th block is an MoE block: with 2, blocks 1, 3, 5, ...
  bool is_moe_block(std::int64_t block) const { return moe() && (block + 1) % moe_every == 0; }

  static void check(const GptConfig& c) {
    if (c.n_embd % c.n_head != 0) {
      throw ConfigError("n_embd (" + std::to_string(c.n_embd) + ") must be divisible by n_head (" +
                            std::to_string(c.n_head) + ")",
                        "n_embd");
    }
    if (c.moe() && c.moe_every > c.n_layer) {
      throw ConfigError("moe_every (" + std::to_string(c.moe_every) + ") exceeds n_layer (" + std::to_string(c.n_layer) +
                            "): no block would be a mixture of experts",
                        "moe_every");
    }
  }
  // The mesh rules on the settled sizes; the experts stay whole under tensor parallelism.
  static void check_mesh(const GptConfig& c, const RunContext& run, const GptConfig& /*yaml*/) {
    nn::check_tensor_parallel({c.n_head, c.n_head, 0, c.vocab_size}, run.parallel);
    nn::check_context_parallel(c.n_head, c.dropout, run.parallel);
    nn::check_pipeline_parallel(c.n_layer, run.parallel);
    if (c.moe()) nn::check_expert_parallel(c, run.parallel);
  }
};

// gpt_moe's defaults: 8 experts, 2 per token.
struct GptMoeConfig : GptConfig {
  GptMoeConfig() { num_experts = 8; }
};

// config.json, both ways: GPT2LMHeadModel's keys; gpt_moe's experts in the record only.
inline const nn::HfFieldTable<GptConfig>& hf_table() {
  using C = GptConfig;
  using nlohmann::json;
  namespace t = nn::hf_transforms;
  static const auto table = [] {
    const auto moe = [](const C& c) { return c.moe(); };
    nn::HfFieldTable<C> f([](const C& c) { return c.moe() ? "model/gpt_moe" : "model/gpt"; });
    f.imports([](const C& c) { return c.moe() ? std::vector<std::string>{} : std::vector<std::string>{"gpt2"}; });
    f.defaults([](const C& c) { return c.moe() ? GptMoeConfig() : GptConfig(); });
    f.written("architectures", [](const C&) { return json::array({"GPT2LMHeadModel"}); })
        .written("model_type", [](const C&) { return "gpt2"; });
    f.field("vocab_size", &C::vocab_size, "vocab_size").field("max_seq_len", &C::max_seq_len, "n_positions");
    f.field("n_embd", &C::n_embd, "n_embd").field("n_layer", &C::n_layer, "n_layer").field("n_head", &C::n_head, "n_head");
    f.written("n_inner", [](const C&) { return nullptr; });
    f.field("activation", &C::activation, "activation_function")
        .transform(t::renamed({{"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"gelu_fast", "gelu_tanh"},
                               {"gelu", "gelu"}},
                              "model/gpt"),
                   t::renamed_out({{"gelu_tanh", "gelu_new"}}));
    f.field("bias", &C::bias, "(GPT-2's biases)", true).transform({}, t::omitted_when(true));
    for (const char* dropout : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
      f.written(dropout, [](const C& c) { return c.dropout; });
    }
    f.expect("layer_norm_epsilon", {1e-5}, 1e-5).expect("scale_attn_weights", {true}, true);
    f.expect("scale_attn_by_inverse_layer_idx", {false}, false).expect("reorder_and_upcast_attn", {false}, false);
    f.expect("tie_word_embeddings", {true}, true);
    f.rule([](const C& c, const json& whole) -> std::string {
      const json inner = whole.value("n_inner", json());
      return inner.is_null() || inner == json(4 * c.n_embd) ? "" : "n_inner is " + inner.dump() + ", not 4 x n_embd";
    });
    f.written("initializer_range", [](const C& c) { return c.init_std; });
    // GPT-2's <|endoftext|> where the vocabulary is GPT-2's (50257 ids, padded up to 50304 at
    // most); another vocabulary's ids are unknown here: none is written.
    for (const char* id : {"bos_token_id", "eos_token_id"}) {
      f.written(id, [](const C& c) { return c.vocab_size >= 50257 && c.vocab_size <= 50304 ? json(50256) : json(); });
    }
    f.written("dtype", [](const C&) { return "float32"; });
    f.field("num_experts", &C::num_experts, "").when(moe).field("top_k", &C::top_k, "").when(moe);
    f.field<std::int64_t>("expert_hidden", &C::expert_hidden, "", json::value_t::discarded, &C::expert_width).when(moe);
    f.field("moe_every", &C::moe_every, "").when(moe);
    f.field("renormalize_topk", &C::renormalize_topk, "").when(moe);
    return f;
  }();
  return table;
}

inline GptConfig settled_by_init_from(const GptConfig& yaml) {
  return nn::settled_by_table(yaml, yaml.moe() ? "gpt_moe" : "gpt", hf_table(), &GptConfig::check);
}

// The fields both models declare; `docs`: what dropout and biases cover in each.
// gpt_moe's experts route whole sequences: no sequence parallelism.
template <class Config>
void declare_gpt_fields(ConfigFields<Config>& f, const char* dropout, const char* bias) {
  using C = GptConfig;
  nn::DecoderDocs decoder;
  decoder.max_seq_len = "longest sequence (size of the position embedding)";
  decoder.dropout = dropout;
  nn::declare_decoder_fields(f, decoder);
  f.field("bias", &C::bias, bias);
  if (!Config().moe()) {  // gpt_moe's experts compute the exact GELU
    f.field("activation", &C::activation,
            "the MLP's GELU: gelu (exact) or gelu_tanh (the tanh approximation GPT-2 uses, Hugging Face's gelu_new)")
        .one_of({"gelu", "gelu_tanh"});
  }
  nn::declare_init_from<C>(f,
                           "start from these weights: a safetensors file, a Tessera export folder, or (model/gpt) a "
                           "Hugging Face GPT-2 folder (config.json + safetensors; architecture fields left out of the "
                           "YAML come from config.json)",
                           &C::check, &settled_by_init_from, &C::check_mesh, /*sequence_slices=*/!Config().moe());
}

// The model as the kit's family spec.
inline nn::FamilySpec family(const GptConfig& c) {
  nn::FamilySpec f = nn::FamilySpec::of(c.moe() ? "model/gpt_moe" : "model/gpt", c, c);
  f.layout = {"wte", "wpe", "h", "ln_f", "lm_head"};
  f.tied = true;
  f.embedding_dropout = c.dropout;
  const nn::NormSpec layer_norm{1e-5, nn::RmsWeight::scale, /*layer_norm=*/true, c.bias};
  f.final_norm = layer_norm;
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    nn::BlockSpec block;
    block.norm = layer_norm;
    block.names = {"ln_1", "attn", "ln_2"};
    block.fused_qkv = true;
    block.attention = {c.n_embd, c.n_head, c.n_head, c.n_embd / c.n_head, c.bias, c.bias, c.dropout};
    nn::FeedForwardSpec& ff = block.feed_forward;
    ff = {"mlp", 4 * c.n_embd, /*gated=*/false, c.activation, c.bias, c.dropout};
    if (c.is_moe_block(i)) {
      ff.module = "moe";
      ff.experts = c.routing();
      ff.expert_width = c.expert_width();
    }
    f.blocks.push_back(block);
  }
  const auto names = [](const std::string& prefix) -> nn::HfWeightNames {
    return {{{"lm_head", ""}, {"", prefix}}, {".c_attn.weight", ".c_proj.weight", ".c_fc.weight"}, ""};
  };
  f.names = names("transformer.");
  // Published GPT-2 files leave `transformer.` out; older ones carry causal-mask buffers.
  f.names_in = [names](const HfCheckpoint& hf) { return names(hf.tensors.count("transformer.wte.weight") ? "transformer." : ""); };
  f.skipped_tensors = [](const std::string& name) {
    return nn::ends_with(name, ".attn.bias") || nn::ends_with(name, ".attn.masked_bias");
  };
  nn::describe_by_table(f, hf_table(), c);
  if (c.moe() || !c.bias) f.hf_config_json = nullptr;  // GPT2LMHeadModel has biases and no experts
  return f;
}

}  // namespace tessera::gpt_family
