// The Llama family's config.json, both ways: what a Hugging Face folder's config.json
// (LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// Qwen3MoeForCausalLM; the older top-level rope_theta/rope_scaling and transformers 5's
// rope_parameters) or a Tessera export's settles in the YAML's config, and the config.json an
// export writes. Kept in one file so that import and export cannot disagree.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llama_config.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/hf_import.hpp"

namespace tessera::llama {

// Qwen3-MoE's experts from config.json: how many, k, their width, the gates' normalisation, which
// blocks route, the balance loss's weight (where the YAML leaves it out).
inline void settle_qwen3_moe_experts(LlamaConfig& c, const HfConfig& json) {
  using hf_import::settle;
  // The Hub's files say num_experts; transformers 5 writes num_local_experts.
  const bool local = !json.has("num_experts") && json.has("num_local_experts");
  const std::string experts_key = local ? "num_local_experts" : "num_experts";
  settle(c.num_experts, "num_experts", c.given, json.integer(experts_key), experts_key, json);
  settle(c.top_k, "top_k", c.given, json.integer("num_experts_per_tok"), "num_experts_per_tok", json);
  settle(c.expert_intermediate_size, "expert_intermediate_size", c.given, json.integer("moe_intermediate_size"),
         "moe_intermediate_size", json);
  settle(c.renormalize_topk, "renormalize_topk", c.given,
         std::optional<bool>(json.boolean("norm_topk_prob").value_or(false)), "norm_topk_prob", json);
  settle(c.moe_every, "moe_every", c.given, std::optional<std::int64_t>(json.integer("decoder_sparse_step").value_or(1)),
         "decoder_sparse_step", json);
  std::vector<std::int64_t> dense;
  if (json.has("mlp_only_layers")) {
    const nlohmann::json listed = nlohmann::json::parse(json.dump()).at("mlp_only_layers");
    if (!listed.is_null() && !listed.is_array()) {
      throw ConfigError(json.file() + ": mlp_only_layers should be a list of block indices", "init_from");
    }
    if (listed.is_array()) {
      for (const auto& block : listed) {
        if (!block.is_number_integer()) throw ConfigError(json.file() + ": mlp_only_layers lists " + block.dump(), "init_from");
        dense.push_back(block.get<std::int64_t>());
      }
    }
  }
  if (!c.given.count("dense_blocks")) {
    c.dense_blocks = dense;
  } else if (c.dense_blocks != dense) {
    throw ConfigError("the YAML's dense_blocks differ from " + json.file() +
                          "'s mlp_only_layers (leave dense_blocks out to take the checkpoint's)",
                      "dense_blocks");
  }
  if (!c.given.count("aux_loss_coef")) {
    if (auto coef = json.number("router_aux_loss_coef")) c.aux_loss_coef = *coef;
  }
}

// The YAML's config with what config.json says filled in; an error where they disagree or where
// the checkpoint is a Llama variant model/llama does not compute.
inline LlamaConfig settle_config(LlamaConfig c, const HfConfig& json) {
  const std::string type = json.string("model_type").value_or("");
  const std::optional<Variant> theirs = variant_of(type);
  if (!theirs || *theirs != c.variant) {
    const std::string imports = c.variant == Variant::llama ? "llama, mixtral" : c.variant_name();
    const std::string use = theirs ? std::string("; use model/") + names_of(*theirs).name
                                   : (type == "gpt2"          ? "; use model/gpt"
                                      : type == "deepseek_v3" ? "; use model/deepseek_v3"
                                                              : "");
    throw ConfigError(json.file() + ": model_type '" + type + "' is not one model/" + c.variant_name() + " imports (" +
                          imports + use + ")",
                      "init_from");
  }
  using hf_import::settle;
  // Mixtral: Llama with a mixture of SwiGLU experts in every block.
  const bool mixtral = type == "mixtral";
  if (c.variant == Variant::llama) {
    settle(c.num_experts, "num_experts", c.given,
           std::optional<std::int64_t>(mixtral ? json.integer("num_local_experts").value_or(8) : 0),
           "num_local_experts", json, mixtral ? "" : "absent from a dense llama", mixtral ? 1 : 0);
  } else {
    if (c.variant == Variant::qwen3_moe) settle_qwen3_moe_experts(c, json);
    // The Qwens' sliding window, where use_sliding_window switches it on.
    const bool windowed = json.boolean("use_sliding_window").value_or(false);
    settle(c.sliding_window, "sliding_window", c.given,
           std::optional<std::int64_t>(windowed ? json.integer("sliding_window").value_or(0) : 0), "sliding_window",
           json, windowed ? "" : "off (use_sliding_window false)", /*at_least=*/0);
    if (windowed && c.variant != Variant::qwen3_moe) {
      settle(c.max_window_layers, "max_window_layers", c.given, json.integer("max_window_layers"),
             "max_window_layers", json, "", /*at_least=*/0);
    }
    if (c.variant != Variant::qwen2) {
      settle(c.attention_bias, "attention_bias", c.given,
             std::optional<bool>(json.boolean("attention_bias").value_or(false)), "attention_bias", json);
    }
  }
  if (mixtral) {
    settle(c.top_k, "top_k", c.given, std::optional<std::int64_t>(json.integer("num_experts_per_tok").value_or(2)),
           "num_experts_per_tok", json);
    if (!c.given.count("aux_loss_coef")) {
      if (auto coef = json.number("router_aux_loss_coef")) c.aux_loss_coef = *coef;
    }
    // Attention over a sliding window shorter than the sequences is not what model/llama computes.
    if (auto window = json.integer("sliding_window"); window && *window < c.max_seq_len &&
                                                      *window < json.integer("max_position_embeddings").value_or(0)) {
      throw ConfigError(json.file() + ": sliding_window " + std::to_string(*window) +
                            " (attention within a window), which model/llama does not compute",
                        "init_from");
    }
  }
  settle(c.vocab_size, "vocab_size", c.given, json.integer("vocab_size"), "vocab_size", json);
  settle(c.n_layer, "n_layer", c.given, json.integer("num_hidden_layers"), "num_hidden_layers", json);
  settle(c.n_head, "n_head", c.given, json.integer("num_attention_heads"), "num_attention_heads", json);
  settle(c.n_embd, "n_embd", c.given, json.integer("hidden_size"), "hidden_size", json);
  std::optional<std::int64_t> kv = json.integer("num_key_value_heads");
  if (!kv) kv = c.n_head;  // Hugging Face's default: no grouping
  // 0 in the YAML means "n_head"; compare what it means.
  if (c.given.count("n_kv_head") && c.n_kv_head == 0) c.n_kv_head = c.n_head;
  settle(c.n_kv_head, "n_kv_head", c.given, kv, "num_key_value_heads", json);
  std::optional<std::int64_t> head_dim = json.integer("head_dim");
  if (!head_dim) head_dim = c.n_embd / c.n_head;
  if (c.given.count("head_dim") && c.head_dim == 0) c.head_dim = c.n_embd / c.n_head;
  settle(c.head_dim, "head_dim", c.given, head_dim, "head_dim", json);
  if (c.given.count("intermediate_size") && c.intermediate_size == 0) c.intermediate_size = c.mlp_size();
  settle(c.intermediate_size, "intermediate_size", c.given, json.integer("intermediate_size"), "intermediate_size",
         json);
  // No weight depends on it (the rotary tables are computed): a YAML max_seq_len may differ from
  // the checkpoint's, e.g. to fine-tune on shorter sequences without tables for 128k positions.
  if (!c.given.count("max_seq_len")) {
    if (auto positions = json.integer("max_position_embeddings")) c.max_seq_len = *positions;
  }
  settle(c.rms_norm_eps, "rms_norm_eps", c.given, json.number("rms_norm_eps"), "rms_norm_eps", json);
  settle(c.tie_embeddings, "tie_embeddings", c.given,
         std::optional<bool>(json.boolean("tie_word_embeddings").value_or(false)), "tie_word_embeddings", json);

  const hf_import::HfRope found = hf_import::settle_rope(c, json);
  const std::string& rope = found.key;
  const std::optional<std::string>& rope_type = found.type;
  if (rope_type && *rope_type == "llama3") {
    auto need = [&](const std::string& key) {
      const auto v = json.number(rope + "." + key);
      if (!v) throw ConfigError(json.file() + ": " + rope + " of type llama3 lacks " + key, "init_from");
      return *v;
    };
    const std::vector<double> scaling = {need("factor"), need("low_freq_factor"), need("high_freq_factor"),
                                         need("original_max_position_embeddings")};
    if (!c.given.count("rope_scaling")) {
      c.rope_scaling = scaling;
    } else if (!c.rope_scaling || *c.rope_scaling != scaling) {
      throw ConfigError("the YAML's rope_scaling differs from " + json.file() + "'s " + rope + " (llama3 factor " +
                            c10::str(scaling[0]) + "); leave rope_scaling out to take the checkpoint's",
                        "rope_scaling");
    }
  } else if (rope_type && *rope_type != "default") {
    throw ConfigError(json.file() + ": " + rope + ".rope_type '" + *rope_type +
                          "' is not one model/llama computes (default, llama3)",
                      "init_from");
  } else if (c.given.count("rope_scaling") && c.rope_scaling) {
    throw ConfigError("the YAML sets rope_scaling but " + json.file() + " has none (leave rope_scaling out)",
                      "rope_scaling");
  }
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) throw ConfigError(json.file() + ": " + what + ", which model/llama does not compute", "init_from");
  };
  const std::string act = json.string("hidden_act").value_or("silu");
  require(act == "silu", "hidden_act is '" + act + "' (model/llama's MLP is SwiGLU with silu)");
  if (c.variant == Variant::llama) require(!json.boolean("attention_bias").value_or(false), "attention_bias is true");
  require(!json.boolean("mlp_bias").value_or(false), "mlp_bias is true");
  LlamaConfig::check(c);
  return c;
}

// The YAML's config with a Tessera export's (its config.json: the component spec of the run that
// wrote it) filled in where the YAML leaves a field out, and an error where they disagree: a
// [n_embd, n_embd] projection has the same shape for any head count, so the weights alone would
// load into a model that splits them otherwise.
inline LlamaConfig settle_export(LlamaConfig c, const HfConfig& exported) {
  const LlamaConfig defaults;
  using hf_import::settle;
  using hf_import::settle_exported;
  hf_import::settle_exported_decoder(c, exported, defaults);
  // 0 means "derived" on either side: compare what each means. Unknown (an old export whose
  // run had its own init_from, and left the field out): not settled.
  const bool unknown_if_left_out = hf_import::exported_from_elsewhere(exported);
  const auto settle_derived = [&](std::int64_t& field, const char* key, std::int64_t derived) {
    const std::optional<std::int64_t> read = hf_import::read_exported<std::int64_t>(exported, key);
    if (!read && unknown_if_left_out) return;
    const std::int64_t written = read.value_or(0);
    if (c.given.count(key) && field == 0) field = derived;
    settle(field, key, c.given, std::optional<std::int64_t>(written > 0 ? written : derived), key, exported);
  };
  settle_derived(c.n_kv_head, "n_kv_head", c.n_head);
  settle_derived(c.head_dim, "head_dim", c.n_embd / c.n_head);
  LlamaConfig derived_mlp = c;
  derived_mlp.intermediate_size = 0;
  settle_derived(c.intermediate_size, "intermediate_size", derived_mlp.mlp_size());
  settle_exported(c.rope_theta, "rope_theta", c.given, exported, defaults.rope_theta);
  settle_exported(c.rms_norm_eps, "rms_norm_eps", c.given, exported, defaults.rms_norm_eps);
  settle_exported(c.tie_embeddings, "tie_embeddings", c.given, exported, defaults.tie_embeddings);
  if (c.variant == Variant::llama) {
    settle_exported(c.num_experts, "num_experts", c.given, exported, defaults.num_experts, /*at_least=*/0);
    settle_exported(c.top_k, "top_k", c.given, exported, defaults.top_k);
  } else {
    settle_exported(c.sliding_window, "sliding_window", c.given, exported, defaults.sliding_window, /*at_least=*/0);
    if (c.variant == Variant::qwen3_moe) {
      // Exports of this variant always write its expert fields; where one is missing the
      // variant's own default (the YAML's value unless given) stands.
      settle_exported(c.num_experts, "num_experts", c.given, exported, c.num_experts);
      settle_exported(c.top_k, "top_k", c.given, exported, c.top_k);
      settle_exported(c.expert_intermediate_size, "expert_intermediate_size", c.given, exported,
                      defaults.expert_intermediate_size, /*at_least=*/0);
      settle_exported(c.moe_every, "moe_every", c.given, exported, defaults.moe_every);
      settle_exported(c.renormalize_topk, "renormalize_topk", c.given, exported, defaults.renormalize_topk);
      if (const auto dense = hf_import::exported_value(exported, "dense_blocks"); dense && dense->is_array()) {
        const auto theirs = dense->get<std::vector<std::int64_t>>();
        if (!c.given.count("dense_blocks")) {
          c.dense_blocks = theirs;
        } else if (c.dense_blocks != theirs) {
          throw ConfigError("the YAML's dense_blocks differ from " + exported.file() +
                                "'s (leave dense_blocks out to take the export's)",
                            "dense_blocks");
        }
      }
    }
    settle_exported(c.max_window_layers, "max_window_layers", c.given, exported, defaults.max_window_layers,
                    /*at_least=*/0);
    if (c.variant == Variant::qwen3) {
      settle_exported(c.attention_bias, "attention_bias", c.given, exported, defaults.attention_bias);
    }
  }
  // rope_scaling: a list, or absent/null for none.
  const std::optional<nlohmann::json> scaling = hf_import::exported_value(exported, "rope_scaling");
  if (hf_import::exported_names(exported, "rope_scaling") || !unknown_if_left_out) {
    std::optional<std::vector<double>> theirs;
    if (scaling) {
      const bool four_numbers = scaling->is_array() && scaling->size() == 4 &&
                                std::all_of(scaling->begin(), scaling->end(), [](const auto& v) { return v.is_number(); });
      if (!four_numbers) {
        throw ConfigError(exported.file() + ": config.rope_scaling should be a list of 4 numbers, got " + scaling->dump(),
                          "init_from");
      }
      theirs = scaling->get<std::vector<double>>();
    }
    if (!c.given.count("rope_scaling")) {
      c.rope_scaling = theirs;
    } else if (c.rope_scaling != theirs) {
      throw ConfigError("the YAML's rope_scaling differs from " + exported.file() + "'s (" +
                            (theirs ? "llama3 factor " + c10::str((*theirs)[0]) : std::string("none")) +
                            "); leave rope_scaling out to take the export's",
                        "rope_scaling");
    }
  }
  LlamaConfig::check(c);
  return c;
}

inline LlamaConfig settled_by_init_from(const LlamaConfig& yaml) {
  return hf_import::settled_by_init_from(yaml, yaml.variant_name(), settle_export, settle_config);
}

// The architecture as built, in the YAML's names (Model::architecture_json): what a Tessera
// export's config.json records, so that settle_export of that export knows every field.
inline std::string architecture_json(const LlamaConfig& c) {
  nlohmann::ordered_json out = {
      {"vocab_size", c.vocab_size},       {"n_layer", c.n_layer},         {"n_head", c.n_head},
      {"n_kv_head", c.kv_heads()},        {"n_embd", c.n_embd},           {"head_dim", c.head_size()},
      {"intermediate_size", c.mlp_size()}, {"max_seq_len", c.max_seq_len}, {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.rms_norm_eps},   {"tie_embeddings", c.tie_embeddings},
      {"num_experts", c.num_experts},     {"top_k", c.top_k},
  };
  out["rope_scaling"] = c.rope_scaling ? nlohmann::ordered_json(*c.rope_scaling) : nlohmann::ordered_json(nullptr);
  if (c.variant != Variant::llama) {
    out.erase("num_experts");
    out.erase("top_k");
    out["sliding_window"] = c.sliding_window;
    out["max_window_layers"] = c.max_window_layers;
    if (c.variant != Variant::qwen2) out["attention_bias"] = c.attention_bias;
    if (c.variant == Variant::qwen3_moe) {
      out.erase("max_window_layers");
      out["num_experts"] = c.num_experts;
      out["top_k"] = c.top_k;
      out["expert_intermediate_size"] = c.expert_size();
      out["moe_every"] = c.moe_every;
      out["dense_blocks"] = c.dense_blocks;
      out["renormalize_topk"] = c.renormalize_topk;
    }
  }
  return out.dump();
}

// config.json of a LlamaForCausalLM (a MixtralForCausalLM with num_experts) with this architecture. Written the way transformers 4 wrote
// it (top-level rope_theta and rope_scaling), which transformers 5 reads too.
// `special_ids`: the imported checkpoint's bos/eos/pad ids (hf_import::special_token_ids), "" when
// the model was not imported: then none is written (null), rather than transformers' defaults.
inline std::string hf_config_json(const LlamaConfig& c, const std::string& special_ids = "") {
  nlohmann::ordered_json rope_scaling = nullptr;
  if (c.rope_scaling) {
    const auto& s = *c.rope_scaling;
    rope_scaling = {{"rope_type", "llama3"},
                    {"factor", s[0]},
                    {"low_freq_factor", s[1]},
                    {"high_freq_factor", s[2]},
                    {"original_max_position_embeddings", static_cast<std::int64_t>(s[3])}};
  }
  const nlohmann::ordered_json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.n_embd},
      {"intermediate_size", c.mlp_size()},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"num_key_value_heads", c.kv_heads()},
      {"head_dim", c.head_size()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.max_seq_len},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", rope_scaling},
      {"attention_bias", false},
      {"attention_dropout", c.dropout},
      {"mlp_bias", false},
      {"tie_word_embeddings", c.tie_embeddings},
      {"initializer_range", c.init_std},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"dtype", "float32"},
  };
  nlohmann::ordered_json out = config;
  if (c.variant != Variant::llama) {
    // Qwen2ForCausalLM (q/k/v biases always, no bias switches) and Qwen3ForCausalLM.
    out["architectures"] = {names_of(c.variant).architecture};
    out["model_type"] = c.variant_name();
    out.erase("mlp_bias");
    if (c.variant == Variant::qwen2) {
      out.erase("attention_bias");
    } else {
      out["attention_bias"] = c.attention_bias;
    }
    out["use_sliding_window"] = c.sliding_window > 0;
    out["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json(nullptr);
    out["max_window_layers"] = c.max_window_layers;
    if (c.variant == Variant::qwen3_moe) {
      out.erase("max_window_layers");
      out["num_experts"] = c.num_experts;
      out["num_experts_per_tok"] = c.top_k;
      out["moe_intermediate_size"] = c.expert_size();
      out["norm_topk_prob"] = c.renormalize_topk;
      out["decoder_sparse_step"] = c.moe_every;
      out["mlp_only_layers"] = c.dense_blocks;
      out["router_aux_loss_coef"] = c.aux_loss_coef;
      out["output_router_logits"] = false;
    }
  }
  if (c.variant == Variant::llama && c.mixture_of_experts()) {
    // MixtralForCausalLM: the same fields, the experts', and no bias switches.
    out["architectures"] = {"MixtralForCausalLM"};
    out["model_type"] = "mixtral";
    out.erase("attention_bias");
    out.erase("mlp_bias");
    out["num_local_experts"] = c.num_experts;
    out["num_experts_per_tok"] = c.top_k;
    out["router_aux_loss_coef"] = c.aux_loss_coef;
    out["output_router_logits"] = false;
    out["router_jitter_noise"] = 0.0;
    out["sliding_window"] = nullptr;
  }
  hf_import::carry_special_token_ids(out, special_ids);
  return out.dump(2) + "\n";
}

}  // namespace tessera::llama
