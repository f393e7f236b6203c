// A model's chat template, found and applied as transformers' apply_chat_template does, and
// which bytes of a rendered conversation are the assistant's (the targets of fine-tuning).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/text/jinja.hpp"

namespace tessera::text {

struct ChatOptions {
  std::string tools_json;      // a JSON list of tool schemas, or empty for none (`tools` is None)
  bool add_generation_prompt = false;
  std::string variables_json;  // a JSON object of further variables (enable_thinking, date_string, ...)
  // Drop a message's keys whose value is null first, as TRL does to rows from `datasets` tables
  // (where every row has every column). apply_chat_template itself keeps them (None).
  bool drop_null_keys = false;
};

struct ChatRendering {
  std::string text;
  // Byte spans of `text` that are targets, in order.
  std::vector<TextSpan> targets;
};

class TESSERA_API ChatTemplate {
 public:
  // `special_tokens_json`: the tokenizer's bos_token, eos_token, ... as a JSON object of strings.
  ChatTemplate(const std::string& source, std::string origin, std::string special_tokens_json = "{}");

  // The template a tokenizer folder publishes, as transformers finds it: chat_template.jinja, else
  // tokenizer_config.json's chat_template (a string, or of a named list the "tool_use" one when
  // `with_tools` and it exists, else "default"). Special tokens from tokenizer_config.json (and
  // special_tokens_map.json). nullopt when the folder has no template; tessera::Error naming the
  // file for one that cannot be read or parsed.
  static std::optional<ChatTemplate> from_folder(const std::string& folder, bool with_tools = false);
  // The template in `path` (a .jinja file, or a tokenizer_config.json / folder holding one), with
  // the special tokens of the tokenizer folder `tokens_folder` (may be empty).
  static ChatTemplate from_path(const std::string& path, const std::string& tokens_folder, bool with_tools = false);

  // apply_chat_template(messages, tokenize=False): `messages_json` is a JSON list of messages.
  // Reasoning fields are aliased (reasoning_content, thinking, reasoning), as transformers does.
  std::string render(const std::string& messages_json, const ChatOptions& options) const;

  // The conversation and its targets: what the template's {% generation %} blocks write where it
  // has them (transformers' assistant mask); otherwise each assistant message's turn, from where
  // the conversation before it (with the generation prompt) ends, through the end-of-turn marker
  // the template writes after an assistant message. tessera::Error where a turn cannot be found
  // (the template renders earlier messages differently once later ones follow, and transforms
  // the assistant's content).
  ChatRendering render_with_targets(const std::string& messages_json, const ChatOptions& options) const;

  const std::string& origin() const { return origin_; }
  const JinjaTemplate& jinja() const { return *template_; }

 private:
  std::string end_of_turn(const ChatOptions& options) const;

  std::shared_ptr<const JinjaTemplate> template_;
  std::string origin_;
  std::string special_tokens_json_;
};

}  // namespace tessera::text
