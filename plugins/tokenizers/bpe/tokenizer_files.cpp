#include "tokenizer_files.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "tessera/error.hpp"

namespace tessera::bpe {
namespace {

using Json = nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Json parse(const std::string& path) {
  try {
    return Json::parse(read_text(path));
  } catch (const Json::exception& e) {
    throw Error(path + ": not a tokenizer file (not JSON: " + std::string(e.what()) + ")");
  }
}

// A pair "a b" (older files) or ["a", "b"] (newer ones).
std::pair<std::string, std::string> merge_of(const Json& entry, const std::string& where) {
  if (entry.is_string()) {
    const std::string text = entry.get<std::string>();
    const auto space = text.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == text.size()) {
      throw Error(where + ": merge '" + text + "' is not two tokens separated by a space");
    }
    return {text.substr(0, space), text.substr(space + 1)};
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    return {entry[0].get<std::string>(), entry[1].get<std::string>()};
  }
  throw Error(where + ": a merge must be \"a b\" or [\"a\", \"b\"], got " + entry.dump());
}

// A ByteLevel pre-tokenizer's settings into `def`; `regex_allowed`: it may add GPT-2's pattern.
void byte_level(const Json& p, BpeDefinition& def, const std::string& where, bool alone) {
  const bool use_regex = p.value("use_regex", true);
  const bool prefix = p.value("add_prefix_space", false);
  if (use_regex) def.split_patterns.push_back(kGpt2Pattern);
  if (prefix && !alone) {
    throw Error(where + ": add_prefix_space on a ByteLevel after other pre-tokenizers is not supported");
  }
  def.add_prefix_space = prefix;
}

void pre_tokenizer(const Json& p, BpeDefinition& def, const std::string& where, bool alone) {
  const std::string type = p.value("type", "");
  if (type == "ByteLevel") {
    byte_level(p, def, where, alone);
  } else if (type == "Split") {
    const Json& pattern = p.value("pattern", Json::object());
    const std::string behavior = p.value("behavior", "");
    if (behavior != "Isolated" || p.value("invert", false)) {
      throw Error(where + ": a Split with behavior " + behavior + (p.value("invert", false) ? ", inverted," : "") +
                  " is not supported (Isolated is)");
    }
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      def.split_patterns.push_back(pattern["Regex"].get<std::string>());
    } else {
      throw Error(where + ": a Split needs a Regex pattern");
    }
  } else if (type == "Sequence") {
    const Json& steps = p.value("pretokenizers", Json::array());
    for (std::size_t i = 0; i < steps.size(); ++i) {
      pre_tokenizer(steps[i], def, where + ".pretokenizers[" + std::to_string(i) + "]", false);
    }
  } else {
    throw Error(where + ": pre-tokenizer type '" + type + "' is not supported (ByteLevel, Split, Sequence are)");
  }
}

}  // namespace

BpeDefinition read_tokenizer_json(const std::string& path) {
  const Json json = parse(path);
  if (!json.is_object() || !json.contains("model") || !json["model"].is_object()) {
    throw Error(path + ": not a tokenizer.json (no model object)");
  }
  BpeDefinition def;
  def.source = path;
  const Json& model = json["model"];
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") throw Error(path + ": model.type is " + type + "; tokenizer/bpe reads BPE models");
  if (model.value("byte_fallback", false)) throw Error(path + ": model.byte_fallback is not supported");
  if (json.contains("normalizer") && !json["normalizer"].is_null()) {
    throw Error(path + ": normalizer " + json["normalizer"].value("type", std::string("?")) +
                " is not supported (byte-level BPE tokenizers have none)");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw Error(path + ": model.vocab is not an object");
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) throw Error(path + ": model.vocab." + token + " is not an integer id");
    def.vocab[token] = id.get<std::int64_t>();
  }
  const Json& merges = model.value("merges", Json::array());
  if (!merges.is_array()) throw Error(path + ": model.merges is not a list");
  for (std::size_t i = 0; i < merges.size(); ++i) def.merges.push_back(merge_of(merges[i], path + ": model.merges[" + std::to_string(i) + "]"));
  def.ignore_merges = model.value("ignore_merges", false);
  for (const auto& added : json.value("added_tokens", Json::array())) {
    if (!added.is_object() || !added.contains("id") || !added.contains("content")) {
      throw Error(path + ": added_tokens entries need id and content");
    }
    def.added.push_back({added["content"].get<std::string>(), added["id"].get<std::int64_t>(), added.value("special", false)});
  }
  if (json.contains("pre_tokenizer") && !json["pre_tokenizer"].is_null()) {
    pre_tokenizer(json["pre_tokenizer"], def, path + ": pre_tokenizer", true);
  }
  return def;
}

BpeDefinition read_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path,
                                    const std::vector<std::string>& special_tokens) {
  BpeDefinition def;
  def.source = vocab_path + " + " + merges_path;
  const Json vocab = parse(vocab_path);
  if (!vocab.is_object()) throw Error(vocab_path + ": not a vocab.json (not an object of token: id)");
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer()) throw Error(vocab_path + ": " + token + " has no integer id");
    def.vocab[token] = id.get<std::int64_t>();
  }
  std::istringstream lines(read_text(merges_path));
  std::size_t number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    def.merges.push_back(merge_of(Json(line), merges_path + ":" + std::to_string(number)));
  }
  for (const auto& token : special_tokens) {
    auto it = def.vocab.find(token);
    if (it == def.vocab.end()) throw Error(vocab_path + " has no special token " + token);
    def.added.push_back({token, it->second, true});
  }
  def.split_patterns.push_back(kGpt2Pattern);
  return def;
}

}  // namespace tessera::bpe
