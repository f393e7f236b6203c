#include "tessera/text/chat_template.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "tessera/error.hpp"

namespace tessera::text {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw tessera::Error("cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Json read_json(const fs::path& path) {
  Json j = Json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw tessera::Error(path.string() + ": not valid JSON");
  return j;
}

Json parse_json(const std::string& text, const char* what) {
  if (text.empty()) return Json();
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw tessera::Error(std::string(what) + " is not valid JSON");
  return j;
}

// transformers' special_tokens_map: the named special tokens as strings (an AddedToken's content).
std::string special_tokens(const fs::path& folder) {
  static const char* const names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};
  Json out = Json::object();
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path path = folder / file;
    if (folder.empty() || !fs::exists(path)) continue;
    const Json config = read_json(path);
    if (!config.is_object()) continue;
    for (const char* name : names) {
      if (out.contains(name) || !config.contains(name)) continue;
      const Json& v = config[name];
      if (v.is_string()) out[name] = v;
      if (v.is_object() && v.contains("content") && v["content"].is_string()) out[name] = v["content"];
    }
  }
  return out.dump();
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template}.
std::optional<std::string> configured_template(const fs::path& config_path, bool with_tools) {
  const Json config = read_json(config_path);
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null()) return std::nullopt;
  const Json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array()) throw tessera::Error(config_path.string() + ": chat_template is neither a string nor a list");
  const auto named = [&](const std::string& name) -> std::optional<std::string> {
    for (const auto& item : t) {
      if (item.is_object() && item.value("name", "") == name && item.contains("template") && item["template"].is_string()) {
        return item["template"].get<std::string>();
      }
    }
    return std::nullopt;
  };
  if (with_tools) {
    if (auto tool_use = named("tool_use")) return tool_use;
  }
  if (auto fallback = named("default")) return fallback;
  throw tessera::Error(config_path.string() + ": chat_template lists named templates but none named 'default'");
}

// Messages as the template sees them: reasoning under its names (and keys with null values
// dropped, where asked).
Json prepared_messages(const Json& messages, bool drop_null_keys) {
  if (!messages.is_array()) throw tessera::Error("the messages are not a list");
  Json out = Json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) throw tessera::Error("a message is not an object");
    Json kept = Json::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!drop_null_keys || !it.value().is_null()) kept[it.key()] = it.value();
    }
    const Json* reasoning = nullptr;
    for (const char* name : {"reasoning_content", "thinking", "reasoning"}) {
      if (!reasoning && kept.contains(name) && !kept[name].is_null()) reasoning = &kept[name];
    }
    if (reasoning) {
      Json aliased = Json::object();
      aliased["thinking"] = *reasoning;
      for (auto it = kept.begin(); it != kept.end(); ++it) aliased[it.key()] = it.value();
      aliased["reasoning_content"] = aliased["thinking"];
      kept = std::move(aliased);
    }
    out.push_back(std::move(kept));
  }
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// apply_chat_template's variables: messages, tools, documents, add_generation_prompt, the special
// tokens, then the caller's variables (which win).
std::string context_json(const Json& messages, const ChatOptions& options, const std::string& special_tokens_json) {
  Json context = Json::object();
  context["messages"] = prepared_messages(messages, options.drop_null_keys);
  context["tools"] = options.tools_json.empty() ? Json() : parse_json(options.tools_json, "the tools");
  context["documents"] = Json();
  context["add_generation_prompt"] = options.add_generation_prompt;
  const Json variables = parse_json(options.variables_json, "the template variables");
  if (!variables.is_null() && !variables.is_object()) throw tessera::Error("the template variables are not a JSON object");
  for (const Json& extra : {parse_json(special_tokens_json, "the special tokens"), variables}) {
    if (!extra.is_object()) continue;
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  }
  return context.dump();
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string origin, std::string special_tokens_json)
    : template_(std::make_shared<const JinjaTemplate>(source, origin)),
      origin_(std::move(origin)),
      special_tokens_json_(std::move(special_tokens_json)) {}

std::optional<ChatTemplate> ChatTemplate::from_folder(const std::string& folder_text, bool with_tools) {
  const fs::path folder(folder_text);
  if (folder.empty() || !fs::is_directory(folder)) return std::nullopt;
  const std::string tokens = special_tokens(folder);
  if (fs::exists(folder / "chat_template.jinja")) {
    const fs::path path = folder / "chat_template.jinja";
    return ChatTemplate(read_file(path), path.string(), tokens);
  }
  const fs::path config = folder / "tokenizer_config.json";
  if (!fs::exists(config)) return std::nullopt;
  auto source = configured_template(config, with_tools);
  if (!source) return std::nullopt;
  return ChatTemplate(*source, config.string() + " (chat_template)", tokens);
}

ChatTemplate ChatTemplate::from_path(const std::string& path_text, const std::string& tokens_folder, bool with_tools) {
  const fs::path path(path_text);
  const std::string tokens = special_tokens(tokens_folder);
  if (fs::is_directory(path)) {
    const fs::path file = path / "chat_template.jinja";
    if (fs::exists(file)) return ChatTemplate(read_file(file), file.string(), tokens);
    return from_path((path / "tokenizer_config.json").string(), tokens_folder, with_tools);
  }
  if (path.extension() == ".json") {
    auto source = configured_template(path, with_tools);
    if (!source) throw tessera::Error(path_text + " has no chat_template");
    return ChatTemplate(*source, path_text + " (chat_template)", tokens);
  }
  return ChatTemplate(read_file(path), path_text, tokens);
}

std::string ChatTemplate::render(const std::string& messages_json, const ChatOptions& options) const {
  return template_->render(context_json(parse_json(messages_json, "the messages"), options, special_tokens_json_)).text;
}

std::string ChatTemplate::end_of_turn(const ChatOptions& options) const {
  static const char* const probe = "TESSERA-END-OF-TURN-PROBE";
  Json messages = Json::array({{{"role", "user"}, {"content", "probe"}}, {{"role", "assistant"}, {"content", probe}}});
  ChatOptions plain = options;
  plain.add_generation_prompt = false;
  std::string text;
  try {
    text = render(messages.dump(), plain);
  } catch (const tessera::Error&) {
    return {};
  }
  const std::size_t at = text.rfind(probe);
  if (at == std::string::npos) return {};
  std::size_t begin = at + std::char_traits<char>::length(probe), end = text.size();
  while (begin < end && is_space(text[begin])) ++begin;
  while (end > begin && is_space(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

ChatRendering ChatTemplate::render_with_targets(const std::string& messages_json, const ChatOptions& options) const {
  const Json messages = parse_json(messages_json, "the messages");
  if (template_->has_generation_blocks()) {
    JinjaOutput rendered = template_->render(context_json(messages, options, special_tokens_json_));
    return {std::move(rendered.text), std::move(rendered.generation)};
  }
  ChatRendering out;
  out.text = render(messages_json, options);
  const std::string marker = end_of_turn(options);
  std::size_t searched_to = 0;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object() || messages[i].value("role", "") != "assistant") continue;
    const std::string where = origin_ + ": message " + std::to_string(i) + " (assistant)";
    Json before = Json::array();
    for (std::size_t k = 0; k < i; ++k) before.push_back(messages[k]);
    ChatOptions prompt = options;
    prompt.add_generation_prompt = true;
    const std::string prefix = i == 0 ? std::string() : render(before.dump(), prompt);
    const std::string content = messages[i].contains("content") && messages[i]["content"].is_string()
                                    ? messages[i]["content"].get<std::string>() : std::string();
    std::size_t begin = std::string::npos;
    if (out.text.compare(0, prefix.size(), prefix) == 0 && prefix.size() >= searched_to) {
      begin = prefix.size();
    } else if (i > 0 && messages[i - 1].contains("content") && messages[i - 1]["content"].is_string()) {
      // The template renders the earlier messages otherwise once more follow (Mistral moves the
      // system prompt to the last user turn): the turn starts where the message before it ends,
      // after what the template writes between the two (the generation prompt's header).
      const std::string previous = messages[i - 1]["content"].get<std::string>();
      const std::size_t in_prefix = previous.empty() ? std::string::npos : prefix.rfind(previous);
      const std::size_t in_text = previous.empty() ? std::string::npos : out.text.find(previous, searched_to);
      if (in_prefix != std::string::npos && in_text != std::string::npos) {
        const std::string header = prefix.substr(in_prefix + previous.size());
        const std::size_t after = in_text + previous.size();
        if (out.text.compare(after, header.size(), header) == 0) begin = after + header.size();
      }
    }
    if (begin == std::string::npos) {
      throw tessera::Error(where + ": the template renders the conversation before this message differently once "
                           "it follows, so its turn cannot be found; give the template {% generation %} blocks "
                           "around what the assistant writes");
    }
    std::size_t end;
    const std::size_t content_at = content.empty() ? std::string::npos : out.text.find(content, begin);
    const std::size_t search_from = content_at == std::string::npos ? begin : content_at + content.size();
    const std::size_t marker_at = marker.empty() ? std::string::npos : out.text.find(marker, search_from);
    if (marker_at != std::string::npos) {
      end = marker_at + marker.size();
    } else if (marker.empty() && content_at != std::string::npos) {
      end = content_at + content.size();
    } else {
      throw tessera::Error(where + ": no end-of-turn marker ('" + marker + "') follows the assistant's turn; give the "
                           "template {% generation %} blocks around what the assistant writes");
    }
    out.targets.push_back({begin, end});
    searched_to = end;
  }
  return out;
}

}  // namespace tessera::text
