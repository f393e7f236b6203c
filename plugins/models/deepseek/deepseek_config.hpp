// model/deepseek_v3's config and the mapping between it and Hugging Face's DeepseekV3ForCausalLM:
// the fields of config.json (rope_parameters with YaRN) and the tensor names (Tessera's are
// Hugging Face's without `model.`; stacked experts one tensor per weight here, one per expert
// there). What the family adds to the kit's decoder and routing fields: multi-head latent
// attention's ranks and head parts, dense first blocks, shared experts, grouped sigmoid routing
// with a correction bias and routed scaling, and the auxiliary-loss-free balancing's speed.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
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
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/latent_attention.hpp"
#include "tessera/nn/mesh_rules.hpp"
#include "tessera/nn/rotary.hpp"
#include "tessera/nn/weight_names.hpp"

namespace tessera::deepseek {

struct DeepseekConfig;
inline DeepseekConfig settled_by_init_from(const DeepseekConfig& yaml);

struct DeepseekConfig : nn::DecoderFields, nn::MoeFields {
  std::int64_t q_lora_rank = 0;  // 0: one q_proj (DeepSeek-V2-Lite's null)
  std::int64_t kv_lora_rank = 32;
  std::int64_t qk_nope_head_dim = 16;
  std::int64_t qk_rope_head_dim = 8;
  std::int64_t v_head_dim = 16;
  std::int64_t intermediate_size = 256;         // the dense blocks' SwiGLU
  std::int64_t expert_intermediate_size = 64;   // moe_intermediate_size
  std::int64_t shared_experts = 1;              // n_shared_experts, each of expert_intermediate_size
  std::int64_t first_dense_blocks = 1;          // first_k_dense_replace
  std::int64_t expert_groups = 1;               // n_group
  std::int64_t expert_groups_kept = 1;          // topk_group
  double routed_scaling = 1.0;                  // routed_scaling_factor
  double rope_theta = 10000.0;
  // YaRN [factor, original_max_seq_len, beta_fast, beta_slow, mscale, mscale_all_dim]; absent: none.
  std::optional<std::vector<double>> rope_yarn;
  bool rope_interleave = true;
  double rms_norm_eps = 1e-6;
  bool tie_embeddings = false;
  bool attention_bias = false;
  // Auxiliary-loss-free balancing: after each step every routed block's correction bias moves by
  // this much towards balance (up for experts loaded below the mean, down above); 0: frozen.
  double bias_update_speed = 0.0;
  std::string init_from;
  std::set<std::string> given;

  DeepseekConfig() {
    num_experts = 8;
    top_k = 2;
    aux_loss_coef = 0.0;  // DeepSeek-V3 balances by its correction bias
  }

  std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool routes(std::int64_t block) const { return block >= first_dense_blocks; }
  std::int64_t routed_blocks() const { return std::max<std::int64_t>(n_layer - first_dense_blocks, 0); }

  std::optional<nn::YarnScaling> yarn() const {
    if (!rope_yarn) return std::nullopt;
    const std::vector<double>& y = *rope_yarn;
    nn::YarnScaling out;
    out.factor = y[0];
    out.original_max_positions = static_cast<std::int64_t>(y[1]);
    out.beta_fast = y[2];
    out.beta_slow = y[3];
    if (y[4] != 0) out.mscale = y[4];
    if (y[5] != 0) out.mscale_all_dim = y[5];
    return out;
  }
  // qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim) squared (transformers'
  // yarn_apply_mscale).
  double softmax_scale() const {
    double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
    if (rope_yarn && (*rope_yarn)[5] != 0) {
      const double m = nn::YarnScaling::mscale_of((*rope_yarn)[0], (*rope_yarn)[5]);
      scale *= m * m;
    }
    return scale;
  }
  nn::LatentAttentionSpec attention() const {
    nn::LatentAttentionSpec s;
    s.hidden = n_embd;
    s.heads = n_head;
    s.q_lora_rank = q_lora_rank;
    s.kv_lora_rank = kv_lora_rank;
    s.qk_nope_head_dim = qk_nope_head_dim;
    s.qk_rope_head_dim = qk_rope_head_dim;
    s.v_head_dim = v_head_dim;
    s.norm_eps = rms_norm_eps;
    s.bias = attention_bias;
    s.softmax_scale = softmax_scale();
    s.interleaved_rotary = rope_interleave;
    s.dropout = dropout;
    return s;
  }
  ExpertRouting routing_options() const {
    ExpertRouting r = routing();
    r.score = RouterScore::sigmoid;
    r.groups = expert_groups;
    r.groups_kept = expert_groups_kept;
    r.routed_scaling = routed_scaling;
    r.correction_bias = true;
    return r;
  }

  static void check(const DeepseekConfig& c) {
    if (c.qk_rope_head_dim % 2 != 0) throw ConfigError("qk_rope_head_dim must be even (rotated pairs)", "qk_rope_head_dim");
    if (c.first_dense_blocks > c.n_layer) {
      throw ConfigError("first_dense_blocks (" + std::to_string(c.first_dense_blocks) + ") exceeds n_layer (" +
                            std::to_string(c.n_layer) + ")",
                        "first_dense_blocks");
    }
    if (c.num_experts % c.expert_groups != 0 || (c.expert_groups > 1 && c.num_experts / c.expert_groups < 2) ||
        c.expert_groups_kept > c.expert_groups || c.top_k > c.expert_groups_kept * (c.num_experts / c.expert_groups)) {
      throw ConfigError("num_experts (" + std::to_string(c.num_experts) + ") in expert_groups (" +
                            std::to_string(c.expert_groups) + ") of at least 2, expert_groups_kept (" +
                            std::to_string(c.expert_groups_kept) + ") of them, must hold top_k (" +
                            std::to_string(c.top_k) + ")",
                        "expert_groups");
    }
    if (c.rope_yarn) {
      const auto& y = *c.rope_yarn;
      if (y.size() != 6 || y[0] <= 0 || y[1] < 1) {
        throw ConfigError("rope_yarn is [factor > 0, original_max_seq_len >= 1, beta_fast, beta_slow, mscale, "
                          "mscale_all_dim] (0 for an mscale: none)",
                          "rope_yarn");
      }
    }
  }

  static void declare(ConfigFields<DeepseekConfig>& f) {
    using C = DeepseekConfig;
    nn::declare_decoder_fields(
        f, nn::DecoderDocs::rotary("attention heads per block", "dropout on the attention probabilities"));
    f.field("q_lora_rank", &C::q_lora_rank, "rank of the query latent (q_a_proj, q_b_proj); 0: one q_proj").at_least(0);
    f.field("kv_lora_rank", &C::kv_lora_rank, "rank of the key/value latent (kv_a_proj_with_mqa, kv_b_proj)").at_least(1);
    f.field("qk_nope_head_dim", &C::qk_nope_head_dim, "a head's query/key part without positions").at_least(0);
    f.field("qk_rope_head_dim", &C::qk_rope_head_dim, "a head's rotated query/key part (one key part for all heads)")
        .at_least(2);
    f.field("v_head_dim", &C::v_head_dim, "a head's value size").at_least(1);
    f.field("intermediate_size", &C::intermediate_size, "hidden width of the dense blocks' SwiGLU").at_least(1);
    f.field("expert_intermediate_size", &C::expert_intermediate_size,
            "hidden width of each routed and shared expert (Hugging Face's moe_intermediate_size)")
        .at_least(1);
    f.field("shared_experts", &C::shared_experts, "experts every token passes through in a routed block (n_shared_experts)")
        .at_least(0);
    f.field("first_dense_blocks", &C::first_dense_blocks,
            "the first blocks keep a dense SwiGLU (first_k_dense_replace)")
        .at_least(0);
    nn::declare_moe_fields(f, {"routed experts per routed block (n_routed_experts)", /*dense_allowed=*/false, "routed blocks"});
    f.field("expert_groups", &C::expert_groups, "routing groups of experts (n_group); a token's experts come from its "
                                                 "expert_groups_kept best groups, each rated by its two best scores")
        .at_least(1);
    f.field("expert_groups_kept", &C::expert_groups_kept, "groups a token's experts come from (topk_group)").at_least(1);
    f.field("routed_scaling", &C::routed_scaling, "the gates multiplied by this (routed_scaling_factor)").greater_than(0);
    f.field("rope_theta", &C::rope_theta, "base of the rotary frequencies").greater_than(0);
    f.field("rope_yarn", &C::rope_yarn,
            "YaRN [factor, original_max_seq_len, beta_fast, beta_slow, mscale, mscale_all_dim] (0 for an mscale: none; "
            "absent: plain rotary)");
    f.field("rope_interleave", &C::rope_interleave, "rotated pairs interleaved (x0, x1), (x2, x3), ... as DeepSeek's");
    f.field("rms_norm_eps", &C::rms_norm_eps, "epsilon of the RMS norms").greater_than(0);
    f.field("tie_embeddings", &C::tie_embeddings, "the output head reuses the token embedding (no lm_head)");
    f.field("attention_bias", &C::attention_bias, "biases on q_a_proj, kv_a_proj_with_mqa and o_proj");
    f.field("bias_update_speed", &C::bias_update_speed,
            "auxiliary-loss-free balancing: after each step every routed block's correction bias moves by this towards "
            "balance (+ for experts below the mean load, - above); 0: frozen")
        .at_least(0);
    nn::declare_init_from<C>(f,
                             "start from these weights: a Hugging Face DeepseekV3ForCausalLM folder (config.json + "
                             "safetensors; fields left out of the YAML come from config.json; multi-token-prediction "
                             "layers are skipped), a Tessera export folder or a safetensors file",
                             &DeepseekConfig::check, &settled_by_init_from, &DeepseekConfig::check_mesh);
  }

  static void check_mesh(const DeepseekConfig& c, const RunContext& run, const DeepseekConfig& yaml) {
    const ParallelDims& dims = run.parallel;
    // The dense blocks' and the shared experts' units divide over tp; the routed experts stay whole.
    nn::check_tensor_parallel({c.n_head, c.n_head, c.first_dense_blocks > 0 ? c.intermediate_size : 0, c.vocab_size, true},
                              dims, !yaml.init_from.empty());
    if (c.shared_experts > 0 && dims.tp > 1 && (c.shared_experts * c.expert_intermediate_size) % dims.tp != 0) {
      throw ConfigError("the shared experts' units (" + std::to_string(c.shared_experts * c.expert_intermediate_size) +
                            ") must be divisible by parallelism.tp (" + std::to_string(dims.tp) + ")",
                        "expert_intermediate_size");
    }
    nn::check_context_parallel(c.n_head, c.dropout, dims);
    nn::check_expert_parallel(c, dims);
    nn::check_pipeline_parallel(c.n_layer, dims);
  }
};

// The whole model's parameters from its config (a pipeline stage holds some of them only).
inline std::int64_t parameter_count(const DeepseekConfig& c) {
  const std::int64_t C = c.n_embd, H = c.n_head;
  const std::int64_t q = c.q_lora_rank > 0 ? C * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * H * c.qk_head_dim()
                                           : C * H * c.qk_head_dim();
  const std::int64_t kv = C * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank +
                          c.kv_lora_rank * H * (c.qk_nope_head_dim + c.v_head_dim);
  const std::int64_t biases = c.attention_bias ? (c.q_lora_rank > 0 ? c.q_lora_rank : 0) + c.kv_lora_rank + c.qk_rope_head_dim + C : 0;
  const std::int64_t attention = q + kv + H * c.v_head_dim * C + biases;
  const std::int64_t dense = 3 * C * c.intermediate_size;
  const std::int64_t routed = C * c.num_experts + c.num_experts * 3 * C * c.expert_intermediate_size +
                              3 * C * c.shared_experts * c.expert_intermediate_size;
  const std::int64_t dense_blocks = std::min(c.first_dense_blocks, c.n_layer);
  return c.vocab_size * C * (c.tie_embeddings ? 1 : 2) + c.n_layer * (attention + 2 * C) + dense_blocks * dense +
         c.routed_blocks() * routed + C;
}

// DeepseekV3ForCausalLM's names: everything under `model.` but the output head; the experts one
// tensor each ("model.layers.N.mlp.experts.E.gate_proj.weight").
inline nn::HfWeightNames deepseek_names() { return {{{"lm_head", ""}, {"", "model."}}, {}, ".experts."}; }

inline DeepseekConfig settle_config(DeepseekConfig c, const HfConfig& json) {
  const std::string type = json.string("model_type").value_or("");
  if (type != "deepseek_v3") {
    const std::string use = type == "llama" || type == "mixtral" ? "; use model/llama"
                            : type == "qwen2" || type == "qwen3" || type == "qwen3_moe" ? "; use model/" + type
                            : type == "gpt2" ? "; use model/gpt"
                                               : "";
    throw ConfigError(json.file() + ": model_type '" + type + "' is not one model/deepseek_v3 imports (deepseek_v3" +
                          use + ")",
                      "init_from");
  }
  using hf_import::settle;
  settle(c.vocab_size, "vocab_size", c.given, json.integer("vocab_size"), "vocab_size", json);
  settle(c.n_layer, "n_layer", c.given, json.integer("num_hidden_layers"), "num_hidden_layers", json);
  settle(c.n_head, "n_head", c.given, json.integer("num_attention_heads"), "num_attention_heads", json);
  settle(c.n_embd, "n_embd", c.given, json.integer("hidden_size"), "hidden_size", json);
  if (const auto kv = json.integer("num_key_value_heads"); kv && *kv != c.n_head) {
    throw ConfigError(json.file() + ": num_key_value_heads " + std::to_string(*kv) +
                          " differs from num_attention_heads; latent attention has one key/value head per query head",
                      "init_from");
  }
  settle(c.q_lora_rank, "q_lora_rank", c.given, std::optional<std::int64_t>(json.integer("q_lora_rank").value_or(0)),
         "q_lora_rank", json, "", 0);
  settle(c.kv_lora_rank, "kv_lora_rank", c.given, json.integer("kv_lora_rank"), "kv_lora_rank", json);
  settle(c.qk_nope_head_dim, "qk_nope_head_dim", c.given, json.integer("qk_nope_head_dim"), "qk_nope_head_dim", json,
         "", 0);
  settle(c.qk_rope_head_dim, "qk_rope_head_dim", c.given, json.integer("qk_rope_head_dim"), "qk_rope_head_dim", json);
  settle(c.v_head_dim, "v_head_dim", c.given, json.integer("v_head_dim"), "v_head_dim", json);
  settle(c.intermediate_size, "intermediate_size", c.given, json.integer("intermediate_size"), "intermediate_size", json);
  settle(c.expert_intermediate_size, "expert_intermediate_size", c.given, json.integer("moe_intermediate_size"),
         "moe_intermediate_size", json);
  settle(c.num_experts, "num_experts", c.given, json.integer("n_routed_experts"), "n_routed_experts", json);
  settle(c.top_k, "top_k", c.given, json.integer("num_experts_per_tok"), "num_experts_per_tok", json);
  settle(c.shared_experts, "shared_experts", c.given,
         std::optional<std::int64_t>(json.integer("n_shared_experts").value_or(0)), "n_shared_experts", json, "", 0);
  settle(c.first_dense_blocks, "first_dense_blocks", c.given,
         std::optional<std::int64_t>(json.integer("first_k_dense_replace").value_or(0)), "first_k_dense_replace", json,
         "", 0);
  settle(c.expert_groups, "expert_groups", c.given, json.integer("n_group"), "n_group", json);
  settle(c.expert_groups_kept, "expert_groups_kept", c.given, json.integer("topk_group"), "topk_group", json);
  settle(c.routed_scaling, "routed_scaling", c.given, json.number("routed_scaling_factor"), "routed_scaling_factor",
         json);
  settle(c.renormalize_topk, "renormalize_topk", c.given,
         std::optional<bool>(json.boolean("norm_topk_prob").value_or(true)), "norm_topk_prob", json);
  settle(c.rms_norm_eps, "rms_norm_eps", c.given, json.number("rms_norm_eps"), "rms_norm_eps", json);
  settle(c.tie_embeddings, "tie_embeddings", c.given,
         std::optional<bool>(json.boolean("tie_word_embeddings").value_or(false)), "tie_word_embeddings", json);
  settle(c.attention_bias, "attention_bias", c.given,
         std::optional<bool>(json.boolean("attention_bias").value_or(false)), "attention_bias", json);
  settle(c.rope_interleave, "rope_interleave", c.given,
         std::optional<bool>(json.boolean("rope_interleave").value_or(true)), "rope_interleave", json);
  if (!c.given.count("max_seq_len")) {
    if (auto positions = json.integer("max_position_embeddings")) c.max_seq_len = *positions;
  }
  const hf_import::HfRope found = hf_import::settle_rope(c, json);
  const std::string& rope = found.key;
  const std::optional<std::string>& rope_type = found.type;
  if (rope_type && *rope_type == "yarn") {
    const auto number = [&](const std::string& key, double fallback) {
      return json.number(rope + "." + key).value_or(fallback);
    };
    const std::optional<double> factor = json.number(rope + ".factor");
    const std::optional<double> original = json.number(rope + ".original_max_position_embeddings");
    if (!factor || !original) {
      throw ConfigError(json.file() + ": " + rope + " of type yarn lacks factor or original_max_position_embeddings",
                        "init_from");
    }
    const std::vector<double> yarn = {*factor,          *original,          number("beta_fast", 32),
                                      number("beta_slow", 1), number("mscale", 0), number("mscale_all_dim", 0)};
    if (!c.given.count("rope_yarn")) {
      c.rope_yarn = yarn;
    } else if (c.rope_yarn != yarn) {
      throw ConfigError("the YAML's rope_yarn differs from " + json.file() + "'s " + rope +
                            "; leave rope_yarn out to take the checkpoint's",
                        "rope_yarn");
    }
  } else if (rope_type && *rope_type != "default") {
    throw ConfigError(json.file() + ": " + rope + ".rope_type '" + *rope_type +
                          "' is not one model/deepseek_v3 computes (default, yarn)",
                      "init_from");
  }
  const std::string act = json.string("hidden_act").value_or("silu");
  if (act != "silu") throw ConfigError(json.file() + ": hidden_act is '" + act + "'; the MLPs are SwiGLU", "init_from");
  const std::string scoring = json.string("scoring_func").value_or("sigmoid");
  if (scoring != "sigmoid") {
    throw ConfigError(json.file() + ": scoring_func '" + scoring + "'; DeepSeek-V3 routes by sigmoid scores",
                      "init_from");
  }
  DeepseekConfig::check(c);
  return c;
}

inline DeepseekConfig settle_export(DeepseekConfig c, const HfConfig& exported) {
  const DeepseekConfig d;
  using hf_import::settle_exported;
  hf_import::settle_exported_decoder(c, exported, d);
  settle_exported(c.q_lora_rank, "q_lora_rank", c.given, exported, d.q_lora_rank, 0);
  settle_exported(c.kv_lora_rank, "kv_lora_rank", c.given, exported, d.kv_lora_rank);
  settle_exported(c.qk_nope_head_dim, "qk_nope_head_dim", c.given, exported, d.qk_nope_head_dim, 0);
  settle_exported(c.qk_rope_head_dim, "qk_rope_head_dim", c.given, exported, d.qk_rope_head_dim);
  settle_exported(c.v_head_dim, "v_head_dim", c.given, exported, d.v_head_dim);
  settle_exported(c.intermediate_size, "intermediate_size", c.given, exported, d.intermediate_size);
  settle_exported(c.expert_intermediate_size, "expert_intermediate_size", c.given, exported, d.expert_intermediate_size);
  settle_exported(c.num_experts, "num_experts", c.given, exported, d.num_experts);
  settle_exported(c.top_k, "top_k", c.given, exported, d.top_k);
  settle_exported(c.shared_experts, "shared_experts", c.given, exported, d.shared_experts, 0);
  settle_exported(c.first_dense_blocks, "first_dense_blocks", c.given, exported, d.first_dense_blocks, 0);
  settle_exported(c.expert_groups, "expert_groups", c.given, exported, d.expert_groups);
  settle_exported(c.expert_groups_kept, "expert_groups_kept", c.given, exported, d.expert_groups_kept);
  settle_exported(c.routed_scaling, "routed_scaling", c.given, exported, d.routed_scaling);
  settle_exported(c.renormalize_topk, "renormalize_topk", c.given, exported, d.renormalize_topk);
  settle_exported(c.rope_theta, "rope_theta", c.given, exported, d.rope_theta);
  settle_exported(c.rope_interleave, "rope_interleave", c.given, exported, d.rope_interleave);
  settle_exported(c.rms_norm_eps, "rms_norm_eps", c.given, exported, d.rms_norm_eps);
  settle_exported(c.tie_embeddings, "tie_embeddings", c.given, exported, d.tie_embeddings);
  settle_exported(c.attention_bias, "attention_bias", c.given, exported, d.attention_bias);
  if (const auto yarn = hf_import::exported_value(exported, "rope_yarn"); yarn && yarn->is_array()) {
    const auto theirs = yarn->get<std::vector<double>>();
    if (!c.given.count("rope_yarn")) {
      c.rope_yarn = theirs;
    } else if (c.rope_yarn != theirs) {
      throw ConfigError("the YAML's rope_yarn differs from " + exported.file() + "'s (leave rope_yarn out)", "rope_yarn");
    }
  }
  DeepseekConfig::check(c);
  return c;
}

inline DeepseekConfig settled_by_init_from(const DeepseekConfig& yaml) {
  return hf_import::settled_by_init_from(yaml, "deepseek_v3", settle_export, settle_config);
}

// The architecture as built, in the YAML's names (what a Tessera export's config.json records).
inline std::string architecture_json(const DeepseekConfig& c) {
  nlohmann::ordered_json out = {
      {"vocab_size", c.vocab_size},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_embd", c.n_embd},
      {"max_seq_len", c.max_seq_len},
      {"q_lora_rank", c.q_lora_rank},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"intermediate_size", c.intermediate_size},
      {"expert_intermediate_size", c.expert_intermediate_size},
      {"num_experts", c.num_experts},
      {"top_k", c.top_k},
      {"shared_experts", c.shared_experts},
      {"first_dense_blocks", c.first_dense_blocks},
      {"expert_groups", c.expert_groups},
      {"expert_groups_kept", c.expert_groups_kept},
      {"routed_scaling", c.routed_scaling},
      {"renormalize_topk", c.renormalize_topk},
      {"rope_theta", c.rope_theta},
      {"rope_interleave", c.rope_interleave},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_embeddings", c.tie_embeddings},
      {"attention_bias", c.attention_bias},
  };
  out["rope_yarn"] = c.rope_yarn ? nlohmann::ordered_json(*c.rope_yarn) : nlohmann::ordered_json(nullptr);
  return out.dump();
}

// config.json of a DeepseekV3ForCausalLM with this architecture (no multi-token-prediction layers).
inline std::string hf_config_json(const DeepseekConfig& c, const std::string& special_ids = "") {
  nlohmann::ordered_json rope = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  if (c.rope_yarn) {
    const auto& y = *c.rope_yarn;
    rope = {{"rope_type", "yarn"},
            {"rope_theta", c.rope_theta},
            {"factor", y[0]},
            {"original_max_position_embeddings", static_cast<std::int64_t>(y[1])},
            {"beta_fast", y[2]},
            {"beta_slow", y[3]}};
    if (y[4] != 0) rope["mscale"] = y[4];
    if (y[5] != 0) rope["mscale_all_dim"] = y[5];
  }
  nlohmann::ordered_json out = {
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"model_type", "deepseek_v3"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.n_embd},
      {"intermediate_size", c.intermediate_size},
      {"moe_intermediate_size", c.expert_intermediate_size},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"num_key_value_heads", c.n_head},
      {"n_shared_experts", c.shared_experts},
      {"n_routed_experts", c.num_experts},
      {"num_experts_per_tok", c.top_k},
      {"routed_scaling_factor", c.routed_scaling},
      {"n_group", c.expert_groups},
      {"topk_group", c.expert_groups_kept},
      {"norm_topk_prob", c.renormalize_topk},
      {"first_k_dense_replace", c.first_dense_blocks},
      {"q_lora_rank", c.q_lora_rank > 0 ? nlohmann::ordered_json(c.q_lora_rank) : nlohmann::ordered_json(nullptr)},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.max_seq_len},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_parameters", rope},
      {"rope_interleave", c.rope_interleave},
      {"attention_bias", c.attention_bias},
      {"attention_dropout", c.dropout},
      {"tie_word_embeddings", c.tie_embeddings},
      {"initializer_range", c.init_std},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"dtype", "float32"},
  };
  hf_import::carry_special_token_ids(out, special_ids);
  return out.dump(2) + "\n";
}

}  // namespace tessera::deepseek
