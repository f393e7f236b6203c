// Tessera's Jinja interpreter on untrusted templates and untrusted conversations (chat templates
// come with downloaded models, conversations with data sets): parse, render, find the assistant's
// turns. An input is a template alone (rendered over a fixed conversation with tools), or
//   TEMPLATE \0 CONVERSATION
// where CONVERSATION is JSON: {"messages": [...], "tools": [...], "add_generation_prompt": bool,
// "extra": {...}}. The structure-aware mutator below changes such a conversation as data sets
// differ (roles, null or typed content, tool calls whose arguments are objects, JSON strings or
// neither, reasoning, missing keys, Llama's builtin_tools) half of the time, and the template's
// bytes the other half; the seeds are the published templates under the conversations of
// tests/fixtures/chat_templates/conversations.json (tools/fuzz/make_seeds.py).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>

#include "fuzz_support.hpp"
#include "tessera/text/chat_template.hpp"

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

using Json = nlohmann::ordered_json;

const char* const kMessages = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
  {"role": "tool", "tool_call_id": "call12345", "content": "21.5"},
  {"role": "assistant", "content": "<think>\nwarm\n</think>\n\nIt is 21.5 degrees.", "reasoning_content": "warm"}])";
const char* const kTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";

struct Input {
  std::string source;
  Json conversation;  // null: the fixed one
};

Input split(const std::uint8_t* data, std::size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  const void* zero = std::memchr(text, 0, size);
  if (!zero) return {std::string(text, size), Json()};
  const auto at = static_cast<std::size_t>(static_cast<const char*>(zero) - text);
  Json conversation = Json::parse(text + at + 1, text + size, nullptr, /*allow_exceptions=*/false);
  if (conversation.is_discarded() || !conversation.is_object()) conversation = Json::object();
  return {std::string(text, at), std::move(conversation)};
}

// One structural change of a conversation, as data sets differ from each other.
void mutate_conversation(Json& c, std::mt19937& rng) {
  const auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % (n ? n : 1)); };
  if (!c.contains("messages") || !c["messages"].is_array()) c["messages"] = Json::parse(kMessages);
  Json& messages = c["messages"];
  if (messages.empty()) messages.push_back({{"role", "user"}, {"content", "hi"}});
  Json& m = messages[pick(messages.size())];
  if (!m.is_object()) m = Json::object();
  static const char* const roles[] = {"system", "user", "assistant", "tool", "ipython", "developer", ""};
  const Json arguments[] = {Json{{"city", "Paris"}}, "{\"city\": \"Paris\"}", "not json {", 42, Json(), Json::array()};
  switch (pick(12)) {
    case 0: m["role"] = roles[pick(7)]; break;
    case 1: m["content"] = Json(); break;
    case 2: m["content"] = Json::array({{{"type", "text"}, {"text", "part"}}, {{"type", "image"}}}); break;
    case 3: m["content"] = pick(2) ? Json(7) : Json{{"text", "an object"}}; break;
    case 4:
      m["role"] = "assistant";
      m["tool_calls"] = Json::array({{{"id", "call0"}, {"type", "function"},
                                      {"function", {{"name", pick(2) ? "brave_search" : "get_weather"},
                                                    {"arguments", arguments[pick(6)]}}}}});
      break;
    case 5: m["tool_calls"] = pick(2) ? Json() : Json("a string"); break;
    case 6: m[pick(2) ? "reasoning_content" : "thinking"] = pick(2) ? Json("because") : Json(); break;
    case 7:
      if (!m.empty()) m.erase(std::next(m.begin(), static_cast<std::ptrdiff_t>(pick(m.size()))).key());
      break;
    case 8:
      if (pick(2) && messages.size() > 1) messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(pick(messages.size())));
      else messages.push_back(messages[pick(messages.size())]);
      break;
    case 9: c["add_generation_prompt"] = !c.value("add_generation_prompt", false); break;
    case 10: {
      const Json tools_choices[] = {Json::parse(kTools), Json(), Json::array(), "tools", Json::array({Json::object()})};
      c["tools"] = tools_choices[pick(5)];
      break;
    }
    default: {
      Json& extra = c["extra"];
      if (!extra.is_object()) extra = Json::object();
      static const char* const names[] = {"builtin_tools", "tools_in_user_message", "enable_thinking", "date_string",
                                          "documents", "custom_tools"};
      const Json values[] = {Json::array({"brave_search", "wolfram_alpha", "code_interpreter"}), true, false,
                             "26 Jul 2024", Json(), Json::array({Json{{"title", "t"}, {"text", "x"}}})};
      extra[names[pick(6)]] = values[pick(6)];
    }
  }
}

void render(const Input& in, std::size_t size) {
  const tessera::text::ChatTemplate chat(in.source, "fuzz.jinja", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  tessera::text::ChatOptions options;
  std::string messages = kMessages;
  options.tools_json = kTools;
  options.add_generation_prompt = size % 2 == 0;
  options.variables_json = R"({"enable_thinking": false, "date_string": "26 Jul 2024"})";
  const Json& c = in.conversation;
  if (c.is_object()) {
    messages = c.contains("messages") ? c["messages"].dump() : "[]";
    options.tools_json = c.contains("tools") && !c["tools"].is_null() ? c["tools"].dump() : "";
    options.add_generation_prompt = c.value("add_generation_prompt", false) == true;
    options.variables_json = c.contains("extra") ? c["extra"].dump() : "{}";
  }
  (void)chat.render(messages, options);
  options.add_generation_prompt = false;
  (void)chat.render_with_targets(messages, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tessera::fuzz::expect_clean([&] { render(split(data, size), size); });
  return 0;
}

// Half of the mutations change the conversation's structure, half the template's bytes.
extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  std::mt19937 rng(seed);
  Input in = split(data, size);
  if (rng() % 2 == 0) {
    std::string source = in.source;
    source.resize(std::max<std::size_t>(source.size() * 2, 64));
    source.resize(LLVMFuzzerMutate(reinterpret_cast<std::uint8_t*>(source.data()), in.source.size(), source.size()));
    in.source = std::move(source);
  } else {
    if (!in.conversation.is_object()) in.conversation = Json{{"messages", Json::parse(kMessages)}, {"tools", Json::parse(kTools)}};
    mutate_conversation(in.conversation, rng);
  }
  std::string out = in.source;
  if (in.conversation.is_object()) out += std::string(1, '\0') + in.conversation.dump();
  if (out.size() > max_size) return size;  // too big: leave the input as it was
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
