// Conversations as token ids with their targets, through the model's own chat template (found as
// transformers finds it, rendered by Tessera's Jinja interpreter) or Tessera's plain rendering.
// Shared by dataset/sft_jsonl and dataset/preference_jsonl, whose configs declare the same fields.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/text/chat_template.hpp"

namespace tessera::chat {

// Tokens and which of them are targets.
struct Example {
  std::vector<std::int64_t> tokens;
  std::vector<bool> target;

  void add(const std::vector<std::int64_t>& ids, bool is_target) {
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    target.insert(target.end(), ids.size(), is_target);
  }
};

// The config fields of how chats are written; a dataset's config derives from it.
struct ChatFormatConfig {
  std::string chat_template = "auto";
  std::string tools;
  std::string tools_field = "tools";
  bool add_generation_prompt = false;
  std::vector<std::string> template_variables;

  template <class Config>
  static void declare_chat_fields(ConfigFields<Config>& f) {
    f.field("chat_template", &ChatFormatConfig::chat_template,
            "auto: the tokenizer folder's chat template (chat_template.jinja or tokenizer_config.json's, as "
            "transformers finds it), else the plain 'ROLE: CONTENT' lines; none: the plain lines; or a path to a "
            ".jinja file or a tokenizer_config.json");
    f.field("tools", &ChatFormatConfig::tools,
            "a JSON file holding the list of tool schemas the template is given as `tools` (empty: none)")
        .existing_path();
    f.field("tools_field", &ChatFormatConfig::tools_field, "a row's own list of tools (it replaces `tools`)");
    f.field("add_generation_prompt", &ChatFormatConfig::add_generation_prompt,
            "render the conversation with the template's generation prompt after it");
    f.field("template_variables", &ChatFormatConfig::template_variables,
            "further template variables as NAME=VALUE, VALUE read as JSON where it is (enable_thinking=false, "
            "date_string=26 Jul 2024)");
  }
};

class ChatEncoder {
 public:
  // Resolves the template; tessera::ConfigError naming the field for what cannot be used.
  ChatEncoder(const Tokenizer& tokenizer, const ChatFormatConfig& config);

  bool templated() const { return template_.has_value(); }
  // Where the template came from, or "Tessera's ROLE: CONTENT lines".
  std::string describe() const;

  // A whole example of the conversation. With a template: its text's tokens (nothing added by the
  // tokenizer: the template writes what it writes), targets as ChatTemplate::render_with_targets
  // says (the template's generation blocks, else each assistant turn through its end-of-turn
  // marker). Without: the tokenizer's BOS, then 'ROLE: CONTENT\n' per message, the assistant's
  // contents and an EOS after each the targets. `row_tools`: the row's own tools, or null.
  // tessera::Error for what the template or tokenizer refuses.
  Example encode(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* row_tools) const;

  // What the tokenizer adds to every encode(): its BOS ids (an example's first tokens in the plain
  // rendering) and what follows the text (its EOS), seen on the empty text.
  const std::vector<std::int64_t>& prefix() const { return prefix_; }
  const std::vector<std::int64_t>& suffix() const { return suffix_; }
  // A piece of an example in the plain rendering: its ids without the prefix and suffix, which an
  // example carries once.
  std::vector<std::int64_t> plain_ids(const std::string& text) const;

  // The text the template writes for `messages` (with the generation prompt when asked), as ids
  // without what the tokenizer adds to every text; with the byte spans each id covers.
  std::vector<std::int64_t> render_ids(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* row_tools,
                                       bool add_generation_prompt, std::string* text = nullptr) const;

  // The ids of text a template wrote (a part of a rendering), without what the tokenizer adds.
  std::vector<std::int64_t> template_text_ids(const std::string& text) const;

  const Tokenizer& tokenizer() const { return tok_; }

 private:
  text::ChatOptions options(const nlohmann::ordered_json* row_tools) const;
  // Text to ids with the ids' byte spans, dropping what the tokenizer adds that is not in the text.
  std::vector<std::int64_t> encode_text(const std::string& text, std::vector<std::pair<std::size_t, std::size_t>>& spans) const;

  Example encode_plain(const nlohmann::ordered_json& messages) const;

  const Tokenizer& tok_;
  std::vector<std::int64_t> prefix_, suffix_;
  std::optional<text::ChatTemplate> template_;
  std::string tools_json_, variables_json_;
  bool add_generation_prompt_ = false;
};

}  // namespace tessera::chat
