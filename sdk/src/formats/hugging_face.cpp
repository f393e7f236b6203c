#include "tessera/formats/hugging_face.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "tessera/formats/durable_file.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/safetensors.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace {

using Json = nlohmann::json;

constexpr const char* kConfig = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Json parse_json_object(const std::string& text, const std::string& file) {
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::exception& e) {
    throw Error(file + ": not valid JSON: " + e.what());
  }
  if (!json.is_object()) throw Error(file + ": expected a JSON object");
  return json;
}

}  // namespace

HfConfig::HfConfig() : json_(std::make_shared<const Json>(Json::object())) {}

HfConfig HfConfig::parse(const std::string& text, const std::string& file) {
  HfConfig config;
  config.file_ = file;
  config.json_ = std::make_shared<const Json>(parse_json_object(text, file));
  return config;
}

namespace {

// The value at a dotted path, or null when any step is missing.
const Json* lookup(const Json& root, const std::string& key) {
  const Json* node = &root;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node->is_null() ? nullptr : node;
}

}  // namespace

bool HfConfig::has(const std::string& key) const { return lookup(*static_cast<const Json*>(json_.get()), key); }

std::optional<std::int64_t> HfConfig::integer(const std::string& key) const {
  const Json* v = lookup(*static_cast<const Json*>(json_.get()), key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw Error(file_ + ": " + key + " should be an integer, got " + v->dump());
  return v->get<std::int64_t>();
}

std::optional<double> HfConfig::number(const std::string& key) const {
  const Json* v = lookup(*static_cast<const Json*>(json_.get()), key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw Error(file_ + ": " + key + " should be a number, got " + v->dump());
  return v->get<double>();
}

std::optional<std::string> HfConfig::string(const std::string& key) const {
  const Json* v = lookup(*static_cast<const Json*>(json_.get()), key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw Error(file_ + ": " + key + " should be a string, got " + v->dump());
  return v->get<std::string>();
}

std::optional<bool> HfConfig::boolean(const std::string& key) const {
  const Json* v = lookup(*static_cast<const Json*>(json_.get()), key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw Error(file_ + ": " + key + " should be true or false, got " + v->dump());
  return v->get<bool>();
}

std::string HfConfig::dump() const { return static_cast<const Json*>(json_.get())->dump(2); }

const std::vector<std::string>& hf_tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json",   "tokenizer_config.json", "special_tokens_map.json",
                                                 "tokenizer.model", "vocab.json",            "merges.txt",
                                                 "chat_template.jinja", "chat_template.json",
                                                 "generation_config.json"};
  return names;
}

bool is_hf_checkpoint(const std::string& path) {
  const fs::path config = fs::path(path) / kConfig;
  std::error_code ec;
  if (!fs::is_directory(path, ec) || !fs::is_regular_file(config, ec)) return false;
  try {
    const Json json = Json::parse(read_text(config));
    return json.is_object() && json.contains("model_type");
  } catch (const std::exception&) {
    return false;  // not ours to judge here: whoever reads it reports what is wrong
  }
}

HfCheckpoint read_hf_checkpoint(const std::string& folder) {
  const fs::path dir(folder);
  HfCheckpoint out;
  out.folder = folder;
  const fs::path config = dir / kConfig;
  if (!fs::is_regular_file(config)) throw Error(folder + ": no " + std::string(kConfig) + " (is it a Hugging Face model folder?)");
  out.config = HfConfig::parse(read_text(config), config.string());

  // Which tensors each file holds: the index's weight_map, or everything in the single file.
  std::map<std::string, std::set<std::string>> expected;  // file -> tensors the index puts there
  const fs::path index = dir / kIndex;
  if (fs::exists(index)) {
    const Json json = parse_json_object(read_text(index), index.string());
    auto map = json.find("weight_map");
    if (map == json.end() || !map->is_object() || map->empty()) {
      throw Error(index.string() + ": no weight_map object naming the tensors' files");
    }
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string()) throw Error(index.string() + ": weight_map." + tensor + " is not a file name");
      const std::string name = file.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
        throw Error(index.string() + ": weight_map." + tensor + " names '" + name + "', not a file in the folder");
      }
      expected[name].insert(tensor);
    }
    for (const auto& [file, tensors] : expected) {
      if (!fs::is_regular_file(dir / file)) {
        throw Error(index.string() + " lists shard " + file + " (holding " + *tensors.begin() +
                    (tensors.size() > 1 ? " and " + std::to_string(tensors.size() - 1) + " more" : std::string()) +
                    "), which is missing from " + folder);
      }
    }
  } else if (fs::is_regular_file(dir / kSingleFile)) {
    expected[kSingleFile];
  } else {
    throw Error(folder + ": no " + std::string(kSingleFile) + " and no " + kIndex + " (the weights are missing)");
  }

  for (const auto& [file, listed] : expected) {
    const std::string path = (dir / file).string();
    SafetensorsFile weights = read_safetensors(path);
    for (auto& [name, tensor] : weights.tensors) {
      if (!listed.empty() && !listed.count(name)) {
        throw Error(path + " holds tensor " + name + ", which " + index.string() + " does not assign to it");
      }
      auto [it, fresh] = out.tensor_file.emplace(name, path);
      if (!fresh) throw Error("tensor " + name + " is in both " + it->second + " and " + path);
      out.tensors[name] = std::move(tensor);
    }
    for (const auto& name : listed) {
      if (!out.tensor_file.count(name)) throw Error(index.string() + " puts tensor " + name + " in " + path + ", which lacks it");
    }
  }
  for (const auto& name : hf_tokenizer_file_names()) {
    if (fs::is_regular_file(dir / name)) out.tokenizer_files.push_back((dir / name).string());
  }
  return out;
}

namespace {

std::string shard_name(std::size_t k, std::size_t n) {
  char text[64];
  std::snprintf(text, sizeof text, "model-%05zu-of-%05zu.safetensors", k, n);
  return text;
}

}  // namespace

void write_hf_checkpoint(const std::string& folder, const HfExport& model, std::uint64_t max_shard_bytes) {
  const fs::path dir(folder);
  write_file_durably((dir / kConfig).string(), model.config_json);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  // Greedy in name order, as transformers shards: a tensor larger than the limit gets a shard
  // of its own.
  std::vector<StateDict> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (const auto& [name, tensor] : model.tensors) {
    const std::uint64_t bytes = tensor.nbytes();
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back()[name] = tensor;
    in_shard += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    write_safetensors((dir / kSingleFile).string(), shards.front(), metadata);
  } else {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::ordered_json::object();
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const std::string name = shard_name(k + 1, shards.size());
      write_safetensors((dir / name).string(), shards[k], metadata);
      for (const auto& entry : shards[k]) index["weight_map"][entry.first] = name;
    }
    write_file_durably((dir / kIndex).string(), index.dump(2) + "\n");
  }
  for (const auto& source : model.files_to_copy) {
    write_file_durably((dir / fs::path(source).filename()).string(), read_text(source));
  }
  fsync_directory(folder);
}

std::uint64_t parse_byte_size(const std::string& text) {
  std::size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  std::string unit = text.substr(end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, double> units = {{"", 1.0},         {"B", 1.0},           {"KB", 1e3},
                                               {"MB", 1e6},       {"GB", 1e9},          {"TB", 1e12},
                                               {"KIB", 1024.0},   {"MIB", 1048576.0},   {"GIB", 1073741824.0},
                                               {"TIB", 1099511627776.0}};
  auto it = units.find(unit);
  double number = 0;
  bool ok = end > 0 && it != units.end();
  if (ok) {
    try {
      std::size_t used = 0;
      number = std::stod(text.substr(0, end), &used);
      ok = used == end && number > 0;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  const double bytes = ok ? number * it->second : 0;
  if (!ok || bytes < 1 || bytes > static_cast<double>(std::numeric_limits<std::int64_t>::max())) {
    throw Error("'" + text + "' is not a size: write bytes (1000000) or a number with a unit (5GB, 500MB, 2GiB)");
  }
  return static_cast<std::uint64_t>(bytes);
}

std::vector<std::int64_t> hf_eos_token_ids(const std::string& folder) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::filesystem::path file = std::filesystem::path(folder) / name;
    if (!std::filesystem::exists(file)) continue;
    std::ifstream in(file);
    const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object()) throw Error(file.string() + ": not a JSON object");
    const auto it = json.find("eos_token_id");
    if (it == json.end() || it->is_null()) continue;
    std::vector<std::int64_t> ids;
    const auto add = [&](const nlohmann::json& id) {
      if (!id.is_number_integer()) {
        throw Error(file.string() + ": eos_token_id must be a token id or a list of them, got " + it->dump());
      }
      ids.push_back(id.get<std::int64_t>());
    };
    if (it->is_array()) {
      for (const auto& id : *it) add(id);
    } else {
      add(*it);
    }
    return ids;
  }
  return {};
}

}  // namespace tessera
