#include "chat_encoding.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "tessera/error.hpp"

namespace tessera::chat {

namespace {

std::string string_field(const nlohmann::ordered_json& row, const char* name) {
  auto it = row.find(name);
  if (it == row.end()) throw tessera::Error(std::string("a message has no field '") + name + "'");
  if (!it->is_string()) throw tessera::Error(std::string("a message's field '") + name + "' is not a string");
  return it->get<std::string>();
}

// NAME=VALUE pairs as a JSON object; VALUE is JSON where it parses as JSON, else a string.
std::string variables_json(const std::vector<std::string>& pairs) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& pair : pairs) {
    const std::size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw tessera::ConfigError("'" + pair + "' is not NAME=VALUE", "template_variables");
    }
    const std::string value = pair.substr(eq + 1);
    auto parsed = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
    out[pair.substr(0, eq)] = parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
  }
  return out.dump();
}

std::string tools_json(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  const auto parsed = nlohmann::ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!in || parsed.is_discarded() || !parsed.is_array()) {
    throw tessera::ConfigError(path + " is not a JSON list of tool schemas", "tools");
  }
  return parsed.dump();
}

}  // namespace

ChatEncoder::ChatEncoder(const Tokenizer& tokenizer, const ChatFormatConfig& c)
    : tok_(tokenizer),
      tools_json_(tools_json(c.tools)),
      variables_json_(variables_json(c.template_variables)),
      add_generation_prompt_(c.add_generation_prompt) {
  const std::vector<std::int64_t> added = tok_.encode("");
  std::size_t leading = 0;
  while (leading < added.size() && tok_.bos_id() >= 0 && added[leading] == tok_.bos_id()) ++leading;
  prefix_.assign(added.begin(), added.begin() + static_cast<std::ptrdiff_t>(leading));
  suffix_.assign(added.begin() + static_cast<std::ptrdiff_t>(leading), added.end());
  try {
    if (c.chat_template == "auto") {
      template_ = text::ChatTemplate::from_folder(tok_.folder(), !tools_json_.empty());
    } else if (c.chat_template != "none") {
      if (!std::filesystem::exists(c.chat_template)) {
        throw tessera::ConfigError("no file " + c.chat_template + " (give auto, none or a path)", "chat_template");
      }
      template_ = text::ChatTemplate::from_path(c.chat_template, tok_.folder(), !tools_json_.empty());
    }
  } catch (const tessera::ConfigError&) {
    throw;
  } catch (const tessera::Error& e) {
    throw tessera::ConfigError(e.what(), "chat_template");
  }
}

std::string ChatEncoder::describe() const {
  return template_ ? "the chat template " + template_->origin() : "Tessera's 'ROLE: CONTENT' lines";
}

text::ChatOptions ChatEncoder::options(const nlohmann::ordered_json* row_tools) const {
  text::ChatOptions o;
  o.tools_json = row_tools && !row_tools->is_null() ? row_tools->dump() : tools_json_;
  o.add_generation_prompt = add_generation_prompt_;
  o.variables_json = variables_json_;
  // Rows from Parquet and `datasets` tables carry every column, null where a message lacks it;
  // TRL removes those None values before the template sees them, and so do we.
  o.drop_null_keys = true;
  return o;
}

std::vector<std::int64_t> ChatEncoder::plain_ids(const std::string& text) const {
  std::vector<std::int64_t> ids = tok_.encode(text);
  const auto ends_with_suffix = [&] {
    return ids.size() >= suffix_.size() &&
           std::equal(suffix_.begin(), suffix_.end(), ids.end() - static_cast<std::ptrdiff_t>(suffix_.size()));
  };
  if (!suffix_.empty() && ends_with_suffix()) ids.erase(ids.end() - static_cast<std::ptrdiff_t>(suffix_.size()), ids.end());
  if (!prefix_.empty() && ids.size() >= prefix_.size() && std::equal(prefix_.begin(), prefix_.end(), ids.begin())) {
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(prefix_.size()));
  }
  return ids;
}

std::vector<std::int64_t> ChatEncoder::encode_text(const std::string& text,
                                                   std::vector<std::pair<std::size_t, std::size_t>>& spans) const {
  // What the tokenizer adds (its BOS, EOS) covers no text: the template writes what it writes.
  try {
    return tessera::encode_written_text(tok_, text, &spans);
  } catch (const std::runtime_error& e) {
    throw tessera::Error(std::string("the tokenizer cannot map the rendered conversation to its tokens: ") + e.what());
  }
}

Example ChatEncoder::encode(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* row_tools) const {
  if (!messages.is_array() || messages.empty()) throw tessera::Error("messages is not a non-empty list");
  if (!template_) return encode_plain(messages);
  const text::ChatRendering r = template_->render_with_targets(messages.dump(), options(row_tools));
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  Example ex;
  ex.tokens = encode_text(r.text, spans);
  ex.target.assign(ex.tokens.size(), false);
  // A token is a target where its bytes meet a target span (transformers marks the tokens from the
  // one holding a span's first character through the one holding its last).
  for (const auto& t : r.targets) {
    for (std::size_t i = 0; i < spans.size(); ++i) {
      if (spans[i].first < t.end && spans[i].second > t.begin) ex.target[i] = true;
    }
  }
  return ex;
}

std::vector<std::int64_t> ChatEncoder::render_ids(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* row_tools,
                                                  bool add_generation_prompt, std::string* text_out) const {
  if (!template_) throw tessera::Error("render_ids needs a chat template");
  text::ChatOptions o = options(row_tools);
  o.add_generation_prompt = add_generation_prompt;
  const std::string text = template_->render(messages.dump(), o);
  if (text_out) *text_out = text;
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  return encode_text(text, spans);
}

std::vector<std::int64_t> ChatEncoder::template_text_ids(const std::string& text) const {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  return encode_text(text, spans);
}

// ROLE: CONTENT\n for every message; the assistant's content and the EOS after it are targets.
Example ChatEncoder::encode_plain(const nlohmann::ordered_json& messages) const {
  Example ex;
  ex.add(prefix_, false);
  for (const auto& m : messages) {
    if (!m.is_object()) throw tessera::Error("a message is not an object");
    const std::string role = string_field(m, "role"), content = string_field(m, "content");
    if (role == "assistant") {
      ex.add(plain_ids(role + ": "), false);
      ex.add(plain_ids(content), true);
      if (tok_.eos_id() >= 0) ex.add({tok_.eos_id()}, true);
      ex.add(plain_ids("\n"), false);
    } else {
      ex.add(plain_ids(role + ": " + content + "\n"), false);
    }
  }
  return ex;
}

}  // namespace tessera::chat
