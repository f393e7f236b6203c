// DeepseekV3ForCausalLM's config.json, both ways: what a Hugging Face folder's config.json
// (rope_parameters with YaRN) or a Tessera export's settles in the YAML's config, and the
// config.json an export writes. Kept in one file so that import and export cannot disagree.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deepseek_config.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/hf_import.hpp"

namespace tessera::deepseek {

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
