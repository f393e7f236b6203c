// model/gpt's config, and the mapping between it and Hugging Face's GPT2LMHeadModel:
// config.json's fields, the tensor names (Tessera uses GPT-2's own, under `transformer.`), the
// Conv1D weights GPT-2 stores [in, out], the tied lm_head, and the causal-mask buffers older
// files carry. Included by gpt.cpp only.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <set>
#include <string>

#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/parameters.hpp"
#include "tessera/nn/weight_names.hpp"
#include "gpt_family.hpp"

namespace tessera::gpt2_format {

struct GptConfig;
// The YAML's config with what init_from's config.json says settled in (defined below).
inline GptConfig settled_by_init_from(const GptConfig& yaml);

struct GptConfig : gpt_family::GptArchitecture {
  std::string init_from;  // a safetensors file, a Tessera export folder or a Hugging Face GPT-2 folder
  std::string activation = "gelu";
  std::set<std::string> given;  // the fields the YAML wrote (the rest may come from config.json)

  static void declare(ConfigFields<GptConfig>& f) {
    gpt_family::declare_gpt_architecture(
        f, {"dropout on embeddings, attention and residual branches", "biases in linear layers and layer norms"});
    f.field("activation", &GptConfig::activation,
            "the MLP's GELU: gelu (exact) or gelu_tanh (the tanh approximation GPT-2 uses, Hugging Face's gelu_new)")
        .one_of({"gelu", "gelu_tanh"});
    f.field("init_from", &GptConfig::init_from,
            "start from these weights: a safetensors file, a Tessera export folder, or a Hugging Face GPT-2 "
            "folder (config.json + safetensors; architecture fields left out of the YAML come from config.json)")
        .existing_path();
    f.record_given(&GptConfig::given);
    f.splits_sequence();
    // With init_from the sizes the YAML leaves out come from its config.json: settled first.
    f.check_in_run([](const GptConfig& c, const RunContext& run) {
      gpt_family::check_mesh(settled_by_init_from(c), run);
    });
  }
};

// GPT2LMHeadModel's names: everything under `transformer.` (published GPT-2 files leave it out:
// `prefix` ""), the projections Conv1D, stored [in, out].
inline nn::HfWeightNames gpt2_names(const std::string& prefix = "transformer.") {
  return {{{"", prefix}}, {".c_attn.weight", ".c_proj.weight", ".c_fc.weight"}, ""};
}

// The YAML's config with what config.json says filled in; an error where they disagree or where
// the checkpoint is a GPT-2 variant model/gpt does not compute.
inline GptConfig settle_config(GptConfig c, const HfConfig& json) {
  return hf_import::at_init_from([&] {
    const std::string type = json.string("model_type").value_or("");
    if (type != "gpt2") {
      throw ConfigError(json.file() + ": model_type '" + type + "' is not one model/gpt imports (gpt2" +
                            (type == "llama" ? "; use model/llama" : "") + ")",
                        "init_from");
    }
    using hf_import::settle;
    settle(c.vocab_size, "vocab_size", c.given, json.integer("vocab_size"), "vocab_size", json);
    settle(c.n_layer, "n_layer", c.given, json.integer("n_layer"), "n_layer", json);
    settle(c.n_head, "n_head", c.given, json.integer("n_head"), "n_head", json);
    settle(c.n_embd, "n_embd", c.given, json.integer("n_embd"), "n_embd", json);
    settle(c.max_seq_len, "max_seq_len", c.given, json.integer("n_positions"), "n_positions", json);
    std::optional<std::string> activation;
    const std::optional<std::string> function = json.string("activation_function");
    if (const auto& f = function) {
      if (*f == "gelu_new" || *f == "gelu_pytorch_tanh" || *f == "gelu_fast") {
        activation = "gelu_tanh";
      } else if (*f == "gelu") {
        activation = "gelu";
      } else {
        throw ConfigError(json.file() + ": activation_function '" + *f +
                              "' is not one model/gpt computes (gelu_new, gelu_pytorch_tanh, gelu)",
                          "init_from");
      }
    }
    settle(c.activation, "activation", c.given, activation, "activation_function", json,
           function ? "'" + *function + "'" : "");
    settle(c.bias, "bias", c.given, std::optional<bool>(true), "(GPT-2's biases)", json);
    // What model/gpt computes one way only: the checkpoint must agree.
    auto require = [&](bool ok, const std::string& what) {
      if (!ok) throw ConfigError(json.file() + ": " + what + ", which model/gpt does not compute", "init_from");
    };
    const double eps = json.number("layer_norm_epsilon").value_or(1e-5);
    require(hf_import::same(eps, 1e-5), "layer_norm_epsilon is " + c10::str(eps) + " (model/gpt's is 1e-5)");
    const auto inner = json.integer("n_inner");
    require(!inner || *inner == 4 * c.n_embd, "n_inner is " + std::to_string(inner.value_or(0)) + ", not 4 x n_embd");
    require(json.boolean("scale_attn_weights").value_or(true), "scale_attn_weights is false");
    require(!json.boolean("scale_attn_by_inverse_layer_idx").value_or(false), "scale_attn_by_inverse_layer_idx is true");
    require(!json.boolean("reorder_and_upcast_attn").value_or(false), "reorder_and_upcast_attn is true");
    require(json.boolean("tie_word_embeddings").value_or(true), "tie_word_embeddings is false (an untied head)");
    if (c.n_embd % c.n_head != 0) {
      throw ConfigError("n_embd (" + std::to_string(c.n_embd) + ") must be divisible by n_head (" +
                            std::to_string(c.n_head) + ")",
                        "n_embd");
    }
    return c;
  });
}

// The YAML's config with a Tessera export's (its config.json: the component spec of the run that
// wrote it) filled in where the YAML leaves a field out, and an error where they disagree: the
// head count and the activation leave the weights' shapes as they are.
inline GptConfig settle_export(GptConfig c, const HfConfig& exported) {
  return hf_import::at_init_from([&] {
    const GptConfig defaults;
    using hf_import::settle_exported;
    hf_import::settle_exported_decoder(c, exported, defaults);
    settle_exported(c.max_seq_len, "max_seq_len", c.given, exported, defaults.max_seq_len);
    settle_exported(c.bias, "bias", c.given, exported, defaults.bias);
    settle_exported(c.activation, "activation", c.given, exported, defaults.activation);
    if (c.n_embd % c.n_head != 0) {
      throw ConfigError("n_embd (" + std::to_string(c.n_embd) + ") must be divisible by n_head (" +
                            std::to_string(c.n_head) + ")",
                        "n_embd");
    }
    return c;
  });
}

inline GptConfig settled_by_init_from(const GptConfig& yaml) {
  return hf_import::settled_by_init_from(yaml, "gpt", settle_export, settle_config);
}

// Copies a Hugging Face GPT-2 checkpoint into `model`'s parameters (GPT-2's names, with or
// without the `transformer.` prefix published files lack). The head is the token embedding: a
// stored lm_head must be that same matrix. Older transformers saved causal-mask buffers with
// every attention layer: not weights.
inline void import_weights(const HfCheckpoint& hf, torch::nn::Module& model, const TensorParallelPlan& plan = {},
                           const TensorParallel& tp = {}, bool partial = false) {
  const nn::HfWeightNames names = gpt2_names(hf.tensors.count("transformer.wte.weight") ? "transformer." : "");
  nn::check_tied_head(hf, "lm_head.weight", names.hf_name("wte.weight"), " (an untied head, which model/gpt cannot hold)");
  nn::import_hf_weights(hf, model, names, plan, tp, {}, 0, partial, [](const std::string& name) {
    return name == "lm_head.weight" || nn::ends_with(name, ".attn.bias") || nn::ends_with(name, ".attn.masked_bias");
  });
}

// config.json and the tensors of a GPT2LMHeadModel equal to `state` (model/gpt's state dict).
// The architecture as built, in the YAML's names (Model::architecture_json): what a Tessera
// export's config.json records, so that settle_export of that export knows every field.
inline std::string architecture_json(const GptConfig& c) {
  const nlohmann::ordered_json out = {
      {"vocab_size", c.vocab_size}, {"n_layer", c.n_layer}, {"n_head", c.n_head},         {"n_embd", c.n_embd},
      {"max_seq_len", c.max_seq_len}, {"bias", c.bias},     {"activation", c.activation},
  };
  return out.dump();
}

// `special_ids`: the imported checkpoint's bos/eos/pad ids (hf_import::special_token_ids), "" when
// the model was not imported.
inline HfExport export_folder(const GptConfig& c, const StateDict& state, const std::string& special_ids = "") {
  // GPT-2's <|endoftext|> where the vocabulary is GPT-2's (50257 ids, padded up to 50304 at most);
  // another vocabulary's ids are unknown here: none is written.
  const bool gpt2_vocabulary = c.vocab_size >= 50257 && c.vocab_size <= 50304;
  const nlohmann::ordered_json endoftext = gpt2_vocabulary ? nlohmann::ordered_json(50256) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.max_seq_len},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"activation_function", c.activation == "gelu_tanh" ? "gelu_new" : "gelu"},
      {"resid_pdrop", c.dropout},
      {"embd_pdrop", c.dropout},
      {"attn_pdrop", c.dropout},
      {"layer_norm_epsilon", 1e-5},
      {"initializer_range", c.init_std},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", true},
      {"bos_token_id", endoftext},
      {"eos_token_id", endoftext},
      {"dtype", "float32"},
  };
  hf_import::carry_special_token_ids(config, special_ids);
  HfExport out;
  out.config_json = config.dump(2) + "\n";
  out.tensors = gpt2_names().export_tensors(state);
  return out;
}

}  // namespace tessera::gpt2_format
