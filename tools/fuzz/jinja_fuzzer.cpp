// Tessera's Jinja interpreter on untrusted templates (chat templates come with downloaded
// models): parse, render over a conversation with tools, and find the assistant's turns.
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "tessera/text/chat_template.hpp"

namespace {

const char* const kMessages = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
  {"role": "tool", "tool_call_id": "call12345", "content": "21.5"},
  {"role": "assistant", "content": "<think>\nwarm\n</think>\n\nIt is 21.5 degrees.", "reasoning_content": "warm"}])";
const char* const kTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  tessera::fuzz::expect_clean([&] {
    const tessera::text::ChatTemplate chat(source, "fuzz.jinja", R"({"bos_token": "<s>", "eos_token": "</s>"})");
    tessera::text::ChatOptions options;
    options.tools_json = kTools;
    options.add_generation_prompt = size % 2 == 0;
    options.variables_json = R"({"enable_thinking": false, "date_string": "26 Jul 2024"})";
    (void)chat.render(kMessages, options);
    options.add_generation_prompt = false;
    (void)chat.render_with_targets(kMessages, options);
  });
  return 0;
}
