// The config of the Llama family's models (model/llama, model/qwen2, model/qwen3,
// model/qwen3_moe): the variants, their YAML fields, checks and mesh rules, and config.json as
// one table (hf_table: import, export and the architecture record; the variants' own rows say
// which variants they hold for). The variants differ in their attention and their experts, each
// difference one of the kit's options: Qwen2's q/k/v biases, Qwen3's per-head q/k norms and
// attention_bias, the Qwens' sliding window; Qwen3-MoE's experts in some blocks
// (decoder_sparse_step, mlp_only_layers) of their own width, gates normalised or not.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/decoder_fields.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/hf_fields.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/mesh_rules.hpp"
#include "tessera/nn/weight_names.hpp"

namespace tessera::llama {

// The family's members, each a model variant named by Hugging Face's model_type.
enum class Variant { llama, qwen2, qwen3, qwen3_moe };

// What each variant is called, which YAML fields it has, and where its routed blocks keep their
// experts under which names (Mixtral's block_sparse_moe with gate, w1, w3, w2; Qwen3-MoE's mlp
// with gate_proj, up_proj, down_proj): the variants as data.
struct VariantFacts {
  const char* name;          // the variant key (model/NAME) and config.json's model_type
  const char* architecture;  // config.json's architectures
  std::vector<std::string> model_types;  // what it imports
  const char* experts_module;
  nn::SwiGluExpertNames expert_names;
  const char* family;         // what init_from starts from
  bool attention_bias;        // Qwen3's attention_bias field
  const char* window;         // where sliding_window applies (null: no window field)
  const char* experts;        // what num_experts counts (null: no expert fields)
  bool routed_blocks;         // Qwen3-MoE's expert width and routed-block pattern
};
inline const VariantFacts& facts_of(Variant v) {
  static const char* kFromMaxWindowLayers = " on the blocks from max_window_layers on";
  static const std::vector<VariantFacts> all = {
      {"llama", "LlamaForCausalLM", {"llama", "mixtral"}, "block_sparse_moe", {}, "Llama or Mixtral", false, nullptr,
       "experts per block's MLP, each a SwiGLU of intermediate_size (Mixtral); 0: the dense MLP", false},
      {"qwen2", "Qwen2ForCausalLM", {"qwen2"}, "mlp", {}, "Qwen2ForCausalLM", false, kFromMaxWindowLayers, nullptr,
       false},
      {"qwen3", "Qwen3ForCausalLM", {"qwen3"}, "mlp", {}, "Qwen3ForCausalLM", true, kFromMaxWindowLayers, nullptr,
       false},
      {"qwen3_moe", "Qwen3MoeForCausalLM", {"qwen3_moe"}, "mlp", {"gate", "gate_proj", "up_proj", "down_proj"},
       "Qwen3MoeForCausalLM", true, " on every block",
       "experts per routed block's MLP, each a SwiGLU of expert_intermediate_size", true}};
  return all[static_cast<std::size_t>(v)];
}

struct LlamaConfig;
// The YAML's config with what init_from's config.json says settled in (by hf_table, below).
inline LlamaConfig settled_by_init_from(const LlamaConfig& yaml);

// The mixture-of-experts fields (num_experts, top_k, ...) are the kit's (nn::MoeFields): a llama
// is dense unless num_experts is set.
struct LlamaConfig : nn::DecoderFields, nn::MoeFields {
  std::int64_t n_kv_head = 0;          // 0: n_head (no grouping)
  std::int64_t head_dim = 0;           // 0: n_embd / n_head
  std::int64_t intermediate_size = 0;  // 0: 8/3 n_embd rounded up to a multiple of 64
  double rope_theta = 10000.0;
  // Llama 3's frequency-dependent RoPE scaling: [factor, low_freq_factor, high_freq_factor,
  // original_max_seq_len]; absent: none.
  std::optional<std::vector<double>> rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;
  std::string init_from;
  std::set<std::string> given;
  // What the variant fixes (not YAML fields): Qwen2's q/k/v biases, Qwen3's q/k norms.
  Variant variant = Variant::llama;
  bool qkv_bias = false;
  bool qk_norm = false;
  // The Qwens' YAML fields: Qwen3's attention_bias (q/k/v and o_proj biases); a sliding window
  // (0: none) on the blocks from max_window_layers on (Hugging Face's use_sliding_window).
  bool attention_bias = false;
  std::int64_t sliding_window = 0;
  std::int64_t max_window_layers = 0;
  // Qwen3-MoE's YAML fields: the experts' width (0: intermediate_size, which the dense blocks
  // keep), and which blocks route (decoder_sparse_step, mlp_only_layers).
  std::int64_t expert_intermediate_size = 0;
  std::int64_t moe_every = 1;
  std::vector<std::int64_t> dense_blocks;

  // Mixtral: every block's MLP a mixture of num_experts SwiGLU experts of intermediate_size, every
  // assignment kept, the balance loss weighted as Mixtral's router_aux_loss_coef.
  LlamaConfig() {
    num_experts = 0;
    aux_loss_coef = 0.02;
  }

  std::int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  const char* variant_name() const { return facts_of(variant).name; }
  bool mixtral() const { return variant == Variant::llama && mixture_of_experts(); }
  bool any_qkv_bias() const { return qkv_bias || attention_bias; }
  std::int64_t expert_size() const { return expert_intermediate_size > 0 ? expert_intermediate_size : mlp_size(); }
  nn::MoeBlockPattern block_pattern() const { return {0, moe_every, dense_blocks}; }
  bool routes(std::int64_t block) const { return mixture_of_experts() && block_pattern().routes(block); }
  std::int64_t routed_block_count() const {
    return mixture_of_experts() ? static_cast<std::int64_t>(block_pattern().routed_blocks(n_layer).size()) : 0;
  }
  bool has_dense_blocks() const { return routed_block_count() < n_layer; }
  // The window of block `block`'s attention (0: the whole causal past).
  std::int64_t window_at(std::int64_t block) const { return block >= max_window_layers ? sliding_window : 0; }
  std::int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  std::int64_t mlp_size() const {
    if (intermediate_size > 0) return intermediate_size;
    const std::int64_t raw = (8 * n_embd + 2) / 3;
    return (raw + 63) / 64 * 64;
  }

  static void check(const LlamaConfig& c) {
    nn::check_grouped_heads(c.n_embd, c.n_head, c.kv_heads(), c.head_dim, c.head_size());
    if (c.mixtral() && !c.renormalize_topk) {
      throw ConfigError("Mixtral divides its k gate probabilities by their sum; renormalize_topk: false is not a "
                        "model model/llama imports or exports",
                        "renormalize_topk");
    }
    for (const std::int64_t block : c.dense_blocks) {
      if (block < 0 || block >= c.n_layer) {
        throw ConfigError("dense_blocks lists block " + std::to_string(block) + " of " + std::to_string(c.n_layer),
                          "dense_blocks");
      }
    }
    if (c.rope_scaling) {
      const auto& s = *c.rope_scaling;
      if (s.size() != 4 || s[0] < 1 || s[1] <= 0 || s[2] <= s[1] || s[3] < 1) {
        throw ConfigError("rope_scaling is [factor >= 1, low_freq_factor > 0, high_freq_factor > low_freq_factor, "
                          "original_max_seq_len >= 1] (Llama 3's)",
                          "rope_scaling");
      }
    }
  }

  static void declare(ConfigFields<LlamaConfig>& f) { declare_fields(f, Variant::llama); }

  // The fields of `variant` (each variant's config type declares its own through this).
  template <class Config>
  static void declare_fields(ConfigFields<Config>& f, Variant variant) {
    using C = LlamaConfig;
    const VariantFacts& facts = facts_of(variant);
    nn::declare_decoder_fields(f, nn::DecoderDocs::rotary("query heads per block",
                                                          "dropout on the attention probabilities (Llama's "
                                                          "attention_dropout)"));
    f.field("n_kv_head", &C::n_kv_head, "key/value heads (grouped-query attention; 0: n_head)").at_least(0);
    f.field("head_dim", &C::head_dim, "size of one attention head (0: n_embd / n_head)").at_least(0);
    f.field("intermediate_size", &C::intermediate_size,
            "hidden width of the SwiGLU MLP (0: 8/3 n_embd rounded up to a multiple of 64)")
        .at_least(0);
    f.field("rope_theta", &C::rope_theta, "base of the rotary position embedding's frequencies").greater_than(0);
    f.field("rope_scaling", &C::rope_scaling,
            "Llama 3 RoPE scaling [factor, low_freq_factor, high_freq_factor, original_max_seq_len] (absent: none)");
    f.field("rms_norm_eps", &C::rms_norm_eps, "epsilon of the RMS norms").greater_than(0);
    f.field("tie_embeddings", &C::tie_embeddings, "the output head reuses the token embedding (no lm_head)");
    if (facts.experts && !facts.routed_blocks) {
      nn::declare_moe_fields(f, {facts.experts, /*dense_allowed=*/true, "blocks"});
    }
    if (facts.attention_bias) {
      f.field("attention_bias", &C::attention_bias, "biases on q_proj, k_proj, v_proj and o_proj (Qwen3's attention_bias)");
    }
    if (facts.window) {
      f.field("sliding_window", &C::sliding_window,
              std::string("attention within this many positions (a query and the window - 1 before it)") +
                  facts.window + "; 0: the whole causal past (Hugging Face's use_sliding_window false)")
          .at_least(0);
    }
    if (facts.window && !facts.routed_blocks) {
      f.field("max_window_layers", &C::max_window_layers,
              "the blocks before this index attend over the whole causal past (with sliding_window)")
          .at_least(0);
    }
    if (facts.routed_blocks) {
      nn::declare_moe_fields(f, {facts.experts, /*dense_allowed=*/false, "routed blocks"});
      f.field("expert_intermediate_size", &C::expert_intermediate_size,
              "hidden width of each expert (Hugging Face's moe_intermediate_size; 0: intermediate_size, the dense "
              "blocks' MLP width)")
          .at_least(0);
      f.field("moe_every", &C::moe_every,
              "block i routes when (i + 1) % moe_every == 0 (Hugging Face's decoder_sparse_step); the others have the "
              "dense SwiGLU of intermediate_size")
          .at_least(1);
      f.field("dense_blocks", &C::dense_blocks, "blocks that keep the dense SwiGLU (Hugging Face's mlp_only_layers)");
    }
    nn::declare_init_from<C>(f,
                             "start from these weights: a Hugging Face " + std::string(facts.family) +
                                 " folder (config.json + safetensors, sharded or not; architecture fields left out of "
                                 "the YAML come from config.json), a Tessera export folder or a safetensors file",
                             &LlamaConfig::check, &settled_by_init_from, &LlamaConfig::check_mesh);
  }

  // The mesh rules on the settled sizes `c` of the YAML's config `yaml`: heads, key/value heads,
  // and a dense MLP's units divide over tensor-parallel ranks (experts stay whole).
  static void check_mesh(const LlamaConfig& c, const RunContext& run, const LlamaConfig& /*yaml*/) {
    const ParallelDims& dims = run.parallel;
    nn::check_tensor_parallel(
        {c.n_head, c.kv_heads(), c.has_dense_blocks() ? c.mlp_size() : 0, c.vocab_size, c.mixture_of_experts()}, dims);
    nn::check_context_parallel(c.n_head, c.dropout, dims, c.window_at(c.n_layer - 1));
    nn::check_expert_parallel(c, dims, "this llama is dense; set num_experts (a Mixtral-style model) or parallelism.ep: 1");
    nn::check_pipeline_parallel(c.n_layer, dims);
  }
};

// model/qwen2: Qwen2 and Qwen2.5 (Qwen2ForCausalLM), transformers' Qwen2Config defaults.
struct Qwen2Config : LlamaConfig {
  Qwen2Config() {
    variant = Variant::qwen2;
    qkv_bias = true;
    rms_norm_eps = 1e-6;
  }
  static void declare(ConfigFields<Qwen2Config>& f) { declare_fields(f, Variant::qwen2); }
};

// model/qwen3_moe: Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention, SwiGLU experts in the
// routed blocks, the balance loss at transformers' router_aux_loss_coef.
struct Qwen3MoeConfig : LlamaConfig {
  Qwen3MoeConfig() {
    variant = Variant::qwen3_moe;
    qk_norm = true;
    rms_norm_eps = 1e-6;
    num_experts = 8;
    aux_loss_coef = 0.001;
  }
  static void declare(ConfigFields<Qwen3MoeConfig>& f) { declare_fields(f, Variant::qwen3_moe); }
};

// model/qwen3: Qwen3 (Qwen3ForCausalLM): RMSNorm on every query and key head.
struct Qwen3Config : LlamaConfig {
  Qwen3Config() {
    variant = Variant::qwen3;
    qk_norm = true;
    rms_norm_eps = 1e-6;
  }
  static void declare(ConfigFields<Qwen3Config>& f) { declare_fields(f, Variant::qwen3); }
};

// The variant's defaults: what a field an export's YAML left out stood for.
inline LlamaConfig defaults_of(Variant v) {
  static const std::vector<LlamaConfig> all = {LlamaConfig(), Qwen2Config(), Qwen3Config(), Qwen3MoeConfig()};
  return all[static_cast<std::size_t>(v)];
}

// config.json, both ways, every variant: the YAML field, Hugging Face's key, its value when
// absent, the transform; the rows of some variants only say which.
inline const nn::HfFieldTable<LlamaConfig>& hf_table() {
  using C = LlamaConfig;
  using nlohmann::json;
  namespace t = nn::hf_transforms;
  static const auto table = [] {
    const auto is = [](std::set<Variant> vs) { return [vs](const C& c) { return vs.count(c.variant) > 0; }; };
    const auto qwen = is({Variant::qwen2, Variant::qwen3, Variant::qwen3_moe});
    const auto moe = [](const C& c) { return c.mixtral() || c.variant == Variant::qwen3_moe; };
    const auto mixtral = [](const C& c) { return c.mixtral(); };
    const auto dense_llama = [](const C& c) { return c.variant == Variant::llama && !c.mixtral(); };
    const auto mixtral_file = [](const json& whole) { return whole.value("model_type", "") == "mixtral"; };
    nn::HfFieldTable<C> f([](const C& c) { return std::string("model/") + c.variant_name(); });
    f.imports([](const C& c) { return facts_of(c.variant).model_types; }).defaults([](const C& c) {
      return defaults_of(c.variant);
    });
    f.written("architectures", [](const C& c) {
      return json::array({c.mixtral() ? "MixtralForCausalLM" : facts_of(c.variant).architecture});
    });
    f.written("model_type", [](const C& c) { return c.mixtral() ? "mixtral" : c.variant_name(); });
    nn::causal_lm_rows(f);
    f.field<std::int64_t>("n_kv_head", &C::n_kv_head, "num_key_value_heads", nullptr, &C::kv_heads)
        .transform(t::or_key("num_attention_heads"));
    f.field<std::int64_t>("head_dim", &C::head_dim, "head_dim", nullptr, &C::head_size)
        .transform(t::or_quotient("hidden_size", "num_attention_heads"));
    f.field<std::int64_t>("intermediate_size", &C::intermediate_size, "intermediate_size", json::value_t::discarded,
                          &C::mlp_size);
    f.field("rms_norm_eps", &C::rms_norm_eps, "rms_norm_eps");
    f.field("tie_embeddings", &C::tie_embeddings, "tie_word_embeddings", false);
    f.field("rope_theta", &C::rope_theta, "rope_theta|rope_parameters.rope_theta", 10000.0);
    f.field("rope_scaling", &C::rope_scaling, "rope_scaling", nullptr)
        .transform(t::llama3_rope("model/llama"), t::llama3_rope_out());
    f.expect("hidden_act", {"silu"}, "silu");
    f.expect("mlp_bias", {false}, false, [](const C& c) { return !c.mixtral(); });
    f.expect("attention_bias", {false}, false, dense_llama);
    f.field("attention_bias", &C::attention_bias, "attention_bias", false)
        .when(is({Variant::qwen3, Variant::qwen3_moe}));
    // The Qwens' window, where use_sliding_window switches it on.
    f.written("use_sliding_window", [](const C& c) { return c.sliding_window > 0; }).when(qwen);
    f.field("sliding_window", &C::sliding_window, "sliding_window", nullptr)
        .transform(t::switched_by("use_sliding_window", 0), t::zero_as_null())
        .at_least(0)
        .when(qwen);
    f.field("max_window_layers", &C::max_window_layers, "max_window_layers", nullptr)
        .transform(t::switched_by("use_sliding_window", json::value_t::discarded))
        .at_least(0)
        .when(is({Variant::qwen2, Variant::qwen3}));
    // Mixtral: Llama with experts (num_local_experts) in every block; a dense llama has none.
    f.field("num_experts", &C::num_experts, "num_local_experts", nullptr)
        .transform([=](const json& v, const json& whole) { return mixtral_file(whole) ? (v.is_null() ? json(8) : v) : json(0); },
                   t::omitted_when(0))
        .at_least(0)
        .when(is({Variant::llama}));
    f.field("num_experts", &C::num_experts, "num_experts|num_local_experts").when(is({Variant::qwen3_moe}));
    f.field("top_k", &C::top_k, "num_experts_per_tok", 2).when(moe);
    f.field("expert_intermediate_size", &C::expert_intermediate_size, "moe_intermediate_size",
            json::value_t::discarded, std::function<std::int64_t(const C&)>(&C::expert_size))
        .when(is({Variant::qwen3_moe}));
    f.field("renormalize_topk", &C::renormalize_topk, "norm_topk_prob", false).when(is({Variant::qwen3_moe}));
    f.field("moe_every", &C::moe_every, "decoder_sparse_step", 1).when(is({Variant::qwen3_moe}));
    f.field("dense_blocks", &C::dense_blocks, "mlp_only_layers", json::array())
        .transform(t::null_as_empty())
        .when(is({Variant::qwen3_moe}));
    f.field("aux_loss_coef", &C::aux_loss_coef, "router_aux_loss_coef").fill_only().when(moe);
    f.written("output_router_logits", [](const C&) { return false; }).when(moe);
    f.written("router_jitter_noise", [](const C&) { return 0.0; }).when(mixtral);
    f.written("sliding_window", [](const C&) { return nullptr; }).when(mixtral);
    // Mixtral's attention over a sliding window shorter than the sequences.
    f.rule([](const C& c, const json& whole) -> std::string {
      const json window = whole.value("sliding_window", json());
      const bool short_window = window.is_number_integer() && window.get<std::int64_t>() < c.max_seq_len &&
                                window.get<std::int64_t>() < whole.value("max_position_embeddings", std::int64_t{0});
      return whole.value("model_type", "") == "mixtral" && short_window
                 ? "sliding_window " + window.dump() + " (attention within a window)"
                 : "";
    });
    return f;
  }();
  return table;
}

inline LlamaConfig settled_by_init_from(const LlamaConfig& yaml) {
  return nn::settled_by_table(yaml, yaml.variant_name(), hf_table(), &LlamaConfig::check);
}

}  // namespace tessera::llama
