#include "tessera/core/checkpoint/checkpoint_settings.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"

namespace tessera::core {

std::vector<std::string> tokenizer_files_at(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  std::vector<std::string> files;
  if (!fs::is_directory(path, ec)) return files;
  for (const auto& name : hf_tokenizer_file_names()) {
    if (name == "generation_config.json") continue;  // the model's, not the tokenizer's
    if (fs::is_regular_file(fs::path(path) / name, ec)) files.push_back((fs::path(path) / name).string());
  }
  return files;
}

std::string export_config_json(const std::string& model_config_json, const std::string& architecture_json) {
  if (model_config_json.empty() || architecture_json.empty()) return model_config_json;
  nlohmann::ordered_json spec = nlohmann::ordered_json::parse(model_config_json);
  nlohmann::ordered_json& config = spec["config"];
  if (!config.is_object()) config = nlohmann::ordered_json::object();
  nlohmann::ordered_json architecture;  // a named local: items() below refers to it
  try {
    architecture = nlohmann::ordered_json::parse(architecture_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error("the model's architecture_json() is not JSON (" + std::string(e.what()) + "): " + architecture_json);
  }
  if (!architecture.is_object()) {
    throw Error("the model's architecture_json() is not a JSON object: " + architecture_json);
  }
  for (const auto& [key, value] : architecture.items()) config[key] = value;
  return spec.dump(1);
}

void CheckpointSettings::declare(ConfigFields<CheckpointSettings>& f) {
  using C = CheckpointSettings;
  f.field("dir", &C::dir, "where checkpoints go (default RUN_DIR/checkpoints)");
  f.field("every_steps", &C::every_steps, "save every this many steps (0: only at the end and on request)").at_least(0);
  f.field("keep_last", &C::keep_last, "keep the newest N complete checkpoints (0: keep all)").at_least(0);
  f.field("at_end", &C::at_end, "save when training stops (max_steps, time budget, SIGTERM/SIGINT)");
  f.field("async", &C::async, "copy the state to host memory at the step, write it in the background");
  f.field("export_every_steps", &C::export_every_steps, "export the model as safetensors every N steps (0: never)")
      .at_least(0);
  f.field("export_at_end", &C::export_at_end, "export the model as safetensors when training stops");
  f.field("export_format", &C::export_format,
          "tessera: model.safetensors and the model's component spec; hf: a Hugging Face folder "
          "(config.json, safetensors by Hugging Face names, the tokenizer files) that transformers loads, "
          "adapters merged into the weights; peft: the run's adapter as a PEFT folder (adapter_config.json, "
          "adapter_model.safetensors) that peft loads over the base model")
      .one_of({"tessera", "hf", "peft"});
  f.field("export_max_shard_size", &C::export_max_shard_size,
          "hf: weights larger than this are split into shards with model.safetensors.index.json (5GB, 500MB, bytes)");
  f.field("export_tokenizer", &C::export_tokenizer,
          "hf: the run's tokenizer, a file (tokenizer.json, tokenizer.model) or a folder whose tokenizer files "
          "(tokenizer.json, tokenizer_config.json, ...) are copied into every export")
      .existing_path();
  f.check([](const C& c) {
    try {
      parse_byte_size(c.export_max_shard_size);
    } catch (const Error& e) {
      throw ConfigError(e.what(), "export_max_shard_size");
    }
  });
}

}  // namespace tessera::core
