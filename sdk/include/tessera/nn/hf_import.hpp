// What every kit model needs to import a Hugging Face folder (tessera/formats/hugging_face.hpp) or a
// Tessera export: reading config.json and a Tessera export's record (which a family's table,
// tessera/nn/hf_fields.hpp, settles against the YAML), and copying tensors into parameters with
// every missing, extra or misshapen tensor one error naming it.
#pragma once

#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/formats/safetensors.hpp"

namespace tessera::hf_import {

// Runs `fn`; a read error (a tessera::Error naming the file) becomes a config error at init_from.
template <class Fn>
auto at_init_from(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what(), "init_from");
  }
}

// A Tessera export folder's config.json: the model's component spec as its run wrote it (the
// fields its YAML gave; the others had their defaults). nullopt for a safetensors file, or a
// folder without one. An export of another variant is an error at init_from.
inline std::optional<HfConfig> tessera_export_config(const std::string& from, const std::string& variant) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file = fs::path(from) / "config.json";
  if (!fs::is_directory(from, ec) || !fs::is_regular_file(file, ec)) return std::nullopt;
  return at_init_from([&] {
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    HfConfig config = HfConfig::parse(text.str(), file.string());
    const std::string written = config.string("variant_key").value_or("");
    if (written != variant) {
      throw ConfigError(file.string() + " describes " + (written.empty() ? "no model variant" : "model/" + written) +
                            ", not model/" + variant + " (is it the export of another model?)",
                        "init_from");
    }
    return config;
  });
}

// A Hugging Face folder's config.json alone (its weights are read when the model is built).
inline HfConfig read_config_json(const std::string& folder) {
  const std::string file = (std::filesystem::path(folder) / "config.json").string();
  std::ifstream in(file);
  if (!in) throw Error(file + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return HfConfig::parse(text.str(), file);
}

// The YAML's config with what init_from's config.json says settled in (a Hugging Face folder's
// through `from_hf`, a Tessera export folder's through `from_export`; a safetensors file has
// none: the YAML's sizes stand). Reads no weights: validate checks the mesh against the sizes
// this settles, the same the model is then built with, so it refuses what train refuses. What
// either throws that is not a ConfigError already is one at init_from.
template <class Config, class FromExport, class FromHf>
Config settled_by_init_from(const Config& yaml, const std::string& variant, FromExport from_export, FromHf from_hf) {
  if (yaml.init_from.empty()) return yaml;
  if (!is_hf_checkpoint(yaml.init_from)) {
    const std::optional<HfConfig> exported = tessera_export_config(yaml.init_from, variant);
    return exported ? at_init_from([&] { return from_export(yaml, *exported); }) : yaml;
  }
  return at_init_from([&] { return from_hf(yaml, read_config_json(yaml.init_from)); });
}

// A field of a Tessera export's record (under "config" in its config.json), which the family's
// table (tessera/nn/hf_fields.hpp) settles against the YAML: a weight's shape cannot tell every
// such field (the heads of a [n_embd, n_embd] projection, rope_theta, the activation).
//
// Exports written before exports recorded the built architecture hold the YAML's fields alone:
// one whose run took its architecture from its own init_from (an "init_from" in its config)
// cannot tell a left-out field's value, which then is not settled. Values are read as that
// run's YAML reader read them (an integral 1e3 for an integer, True for a boolean).
inline std::optional<nlohmann::json> exported_value(const HfConfig& config, const std::string& key) {
  const nlohmann::json all = nlohmann::json::parse(config.dump());
  const auto fields = all.find("config");
  if (fields == all.end() || !fields->is_object()) return std::nullopt;
  const auto value = fields->find(key);
  if (value == fields->end() || value->is_null()) return std::nullopt;
  return *value;
}
inline bool exported_from_elsewhere(const HfConfig& config) { return exported_value(config, "init_from").has_value(); }
// The export's value of `key` as a T; nullopt when it is not there.
template <class T>
std::optional<T> read_exported(const HfConfig& config, const std::string& key) {
  const std::optional<nlohmann::json> raw = exported_value(config, key);
  const auto wrong = [&](const char* what) {
    return ConfigError(config.file() + ": config." + key + " should be " + what + ", got " + raw->dump(), "init_from");
  };
  std::optional<T> value;
  if (raw) {
    if constexpr (std::is_same_v<T, std::int64_t>) {
      if (!raw->is_number() || std::floor(raw->get<double>()) != raw->get<double>()) throw wrong("an integer");
      value = raw->is_number_integer() ? raw->get<std::int64_t>() : static_cast<std::int64_t>(raw->get<double>());
    } else if constexpr (std::is_same_v<T, double>) {
      if (!raw->is_number()) throw wrong("a number");
      value = raw->get<double>();
    } else if constexpr (std::is_same_v<T, bool>) {
      const std::string text = raw->is_string() ? raw->get<std::string>() : "";
      if (raw->is_boolean()) {
        value = raw->get<bool>();
      } else if (text == "True" || text == "TRUE" || text == "False" || text == "FALSE") {
        value = text[0] == 'T';
      } else {
        throw wrong("true or false");
      }
    } else {
      if (!raw->is_string()) throw wrong("a string");
      value = raw->get<std::string>();
    }
  }
  return value;
}

// The special token ids an imported config.json names (bos_token_id, eos_token_id, pad_token_id:
// an id, a list of ids, or null), as a JSON object, for the model's Hugging Face export to carry:
// without them transformers assumes its own defaults (a Llama's bos 1 and eos 2), and the
// exported model would stop generating at the wrong token.
inline std::string special_token_ids(const HfConfig& config) {
  const nlohmann::json all = nlohmann::json::parse(config.dump());
  nlohmann::json ids = nlohmann::json::object();
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (all.contains(key)) ids[key] = all[key];
  }
  return ids.dump();
}

// Writes `ids` (from special_token_ids) into an export's config over what it had.
inline void carry_special_token_ids(nlohmann::ordered_json& config, const std::string& ids) {
  if (ids.empty()) return;
  const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(ids);  // items() refers to it
  for (const auto& [key, value] : parsed.items()) config[key] = value;
}

// Copies checkpoint tensors into parameters, remembering which it used.
class WeightImport {
 public:
  explicit WeightImport(const HfCheckpoint& checkpoint) : checkpoint_(checkpoint) {}

  bool has(const std::string& name) const { return checkpoint_.tensors.count(name) > 0; }
  const at::Tensor& tensor(const std::string& name) {
    auto it = checkpoint_.tensors.find(name);
    if (it == checkpoint_.tensors.end()) {
      throw ConfigError(checkpoint_.folder + " has no tensor " + name + " (is it a checkpoint of this architecture and size?)",
                        "init_from");
    }
    used_.insert(name);
    return it->second;
  }

  // target <- the checkpoint's `name`, transposed first when `transposed` (GPT-2's Conv1D
  // weights are stored [in, out]); under tensor or expert parallelism this rank's part of it
  // (`shard`, split over `ranks`).
  void copy(const std::string& name, const at::Tensor& target, bool transposed = false, const TensorShard& shard = {},
            ShardRanks ranks = {}) {
    copy_from(name, tensor(name), target, transposed, shard, ranks);
  }
  // The same from `source`, a tensor made of the checkpoint's (e.g. experts stacked), reported as `name`.
  void copy_from(const std::string& name, at::Tensor source, const at::Tensor& target, bool transposed = false,
                 const TensorShard& shard = {}, ShardRanks ranks = {}) {
    const at::Tensor stored = source;
    if (transposed && source.dim() == 2) source = source.t();
    const std::vector<std::int64_t> whole = whole_shape(target.sizes(), shard, ranks);
    if (source.sizes() != at::IntArrayRef(whole)) {
      std::vector<std::int64_t> needed = whole;  // as stored
      if (transposed) std::reverse(needed.begin(), needed.end());
      const auto file = checkpoint_.tensor_file.find(name);
      throw ConfigError((file != checkpoint_.tensor_file.end() ? file->second : checkpoint_.folder) + ": tensor " + name +
                            " has shape " + c10::str(stored.sizes()) + ", the model needs " + c10::str(at::IntArrayRef(needed)) +
                            (transposed ? " (stored transposed)" : "") + "; does config.json match the weights?",
                        "init_from");
    }
    c10::NoGradGuard no_grad;
    at::Tensor(target).copy_(part_of(source, shard, ranks));
  }

  // Known tensors that are not weights (GPT-2's causal-mask buffers): not reported as extra.
  void ignore(const std::function<bool(const std::string&)>& known) {
    for (const auto& item : checkpoint_.tensors) {
      if (known(item.first)) used_.insert(item.first);
    }
  }

  // Throws naming the tensors nothing took.
  // Every tensor of the checkpoint was taken, or names those that were not. `partial`: the model
  // is one pipeline stage, which takes its own tensors only (the others are other stages').
  void finish(bool partial = false) const {
    if (partial) return;
    std::string extra;
    std::size_t count = 0;
    for (const auto& item : checkpoint_.tensors) {
      if (used_.count(item.first)) continue;
      if (count++ < 5) extra += (extra.empty() ? "" : ", ") + item.first;
    }
    if (count > 0) {
      throw ConfigError(checkpoint_.folder + " has " + std::to_string(count) + " tensor" + (count > 1 ? "s" : "") +
                            " this model does not have: " + extra + (count > 5 ? ", ..." : "") +
                            " (is it a checkpoint of this architecture?)",
                        "init_from");
    }
  }

 private:
  const HfCheckpoint& checkpoint_;
  std::set<std::string> used_;
};

// Weights by the model's own parameter names and shapes: a Tessera export folder (its
// model.safetensors) or a safetensors file. Missing, extra and misshapen tensors are errors at
// init_from, as for a Hugging Face folder.
inline void load_tessera_weights(torch::nn::Module& model, const std::string& from, const TensorParallelPlan& plan = {},
                                 const TensorParallel& tp = {}, const ExpertParallel& ep = {}, bool partial = false) {
  std::filesystem::path path(from);
  if (std::filesystem::is_directory(path)) path /= "model.safetensors";
  HfCheckpoint file;
  file.folder = path.string();
  at_init_from([&] {
    for (auto& [name, tensor] : read_safetensors(path.string()).tensors) {
      file.tensor_file[name] = path.string();
      file.tensors[name] = std::move(tensor);
    }
  });
  WeightImport weights(file);
  for (const auto& item : model.named_parameters()) {
    const TensorShard shard = shard_in(plan, item.key());
    weights.copy(item.key(), item.value(), false, shard, ranks_of(shard, tp, ep));
  }
  weights.finish(partial);
}

}  // namespace tessera::hf_import
