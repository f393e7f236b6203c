// Tessera's Jinja interpreter (tessera/text/jinja.hpp) and chat templates
// (tessera/text/chat_template.hpp) on what templates rely on. Jinja2's own output for a wider table
// of cases, and for the published chat templates, is compared in
// tests/integration/chat_template_test.cpp against transformers.
#include <gtest/gtest.h>

#include <string>

#include "tessera/error.hpp"
#include "tessera/text/chat_template.hpp"
#include "tessera/text/jinja.hpp"
#include "test_support.hpp"

namespace {

using tessera::text::ChatOptions;
using tessera::text::ChatTemplate;
using tessera::text::JinjaTemplate;

std::string render(const std::string& source, const std::string& context = "{}") {
  return JinjaTemplate(source, "t.jinja").render(context).text;
}

std::string error_of(const std::string& source, const std::string& context = "{}") {
  try {
    render(source, context);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Jinja, BlocksTrimTheirLineAsTransformersSetsJinja) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before it.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("x {%+ if true %}y{% endif +%}\nz"), "x y\nz");
  EXPECT_EQ(render("line\n    {{ 'v' }}\n"), "line\n    v");  // a print keeps its indentation
  EXPECT_EQ(render("a\r\nb{# c #}\r\n"), "a\nb");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, ValuesPrintAsPythonPrintsThem) {
  EXPECT_EQ(render("{{ 7 / 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-7 }} {{ -7 // 2 }} {{ -7 % 3 }}"),
            "3.5 0.30000000000000004 1e+20 1e-07 -4 2");
  EXPECT_EQ(render("{{ [1, 'a', none, true] }} {{ {'k': 'it\\'s'} }} {{ (1,) }}"), "[1, 'a', None, True] {'k': \"it's\"} (1,)");
  EXPECT_EQ(render("{{ x }}|{{ x.y is defined }}", R"({"x": {"z": 1}})"), "{'z': 1}|False");
  EXPECT_EQ(render("{{ v | tojson }}", R"({"v": {"b": [1, 2.5, null], "a": "é\n"}})"),
            R"({"b": [1, 2.5, null], "a": "é\n"})");
  EXPECT_EQ(render("{{ v | tojson(indent=2) }}", R"({"v": {"a": [1]}})"), "{\n  \"a\": [\n    1\n  ]\n}");
}

TEST(Jinja, ScopesAreJinjasLoopsKeepTheirSetsNamespacesCarryThemOut) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"), "231");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% for x in [10, 20, 30] if x > 10 %}{{ loop.index }}/{{ loop.length }}{{ loop.last }} {% endfor %}"),
            "1/2False 2/2True ");
  EXPECT_EQ(render("{% macro m(a, b='!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}{{ m(b='?', a='y') }}"), "x!y?");
  EXPECT_EQ(render("{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "02");
}

TEST(Jinja, PythonStringMethodsCountCodePoints) {
  EXPECT_EQ(render("{{ s[1:3] }} {{ s[::-1] }} {{ s | length }} {{ s.find('l') }}", R"({"s": "héllo"})"), "él olléh 5 2");
  EXPECT_EQ(render("{{ '</think>\\n\\nA'.split('</think>')[-1].lstrip('\\n') }}|{{ ' a  b '.split() }}"), "A|['a', 'b']");
}

TEST(Jinja, GenerationBlocksGiveTheirBytes) {
  const auto out = JinjaTemplate("{% for m in ms %}{{ m.role }}:{% generation %}{{ m.c }}{% endgeneration %}|{% endfor %}", "t")
                       .render(R"({"ms": [{"role": "u", "c": "é"}, {"role": "a", "c": "ok"}]})");
  EXPECT_EQ(out.text, "u:é|a:ok|");
  ASSERT_EQ(out.generation.size(), 2u);
  EXPECT_EQ(out.text.substr(out.generation[0].begin, out.generation[0].end - out.generation[0].begin), "é");
  EXPECT_EQ(out.text.substr(out.generation[1].begin, out.generation[1].end - out.generation[1].begin), "ok");
}

TEST(Jinja, ErrorsNameTheTemplateLineAndColumn) {
  EXPECT_EQ(error_of("ok\n{{ raise_exception('roles must alternate') }}"), "t.jinja:2:19: the template raised an error: roles must alternate");
  EXPECT_EQ(error_of("{% include 'x' %}"),
            "t.jinja:1:4: the statement 'include' is not supported by Tessera's Jinja interpreter (chat templates use "
            "if, for, set, macro, filter, break, continue and generation)");
  EXPECT_EQ(error_of("a\n  {{ x.y.z }}"), "t.jinja:2:7: 'x' is undefined, so it has no attribute 'y'");
  EXPECT_EQ(error_of("{% if true %}open"), "t.jinja:1:18: unexpected end of template; expected 'elif'");
  EXPECT_EQ(error_of("{{ [1] | nosuch }}"), "t.jinja:1:10: no filter named 'nosuch'");
  // Raised by a statement rather than an expression (found by tools/fuzz/jinja_fuzzer).
  EXPECT_EQ(error_of("{% set a, b = 1 %}"), "t.jinja:1:4: 'int' object is not iterable");
  EXPECT_EQ(error_of("{{ [1].append(2) }}"),
            "t.jinja:1:14: access to attribute 'append' of 'list' object is unsafe (templates cannot change values)");
}

// Data handed to a filter of another kind (a tool call's arguments as a JSON string where the
// template wants a dict: Llama 3.1's builtin tools, Qwen3-Coder) is Python's TypeError, positioned;
// it crashed the process once (a null dict dereferenced).
TEST(Jinja, ValuesOfTheWrongKindAreErrorsNeverCrashes) {
  const std::string call = R"({"a": "{\"city\": \"Paris\"}", "n": 3, "l": [1]})";
  EXPECT_EQ(error_of("{% for k, v in a|items %}{{ k }}{% endfor %}", call), "t.jinja:1:18: Can only get item pairs from a mapping.");
  EXPECT_EQ(error_of("{{ a|dictsort }}", call), "t.jinja:1:6: expected a dict, got str '{\"city\": \"Paris\"}'");
  EXPECT_EQ(error_of("{{ n|join }}", call), "t.jinja:1:6: 'int' object is not iterable");
  EXPECT_EQ(error_of("{{ l|select(1)|list }}", call), "t.jinja:1:6: expected a str, got int 1");
  EXPECT_EQ(error_of("{{ n() }}", call), "t.jinja:1:5: 3 is not callable");
  EXPECT_EQ(error_of("{{ l|map('upper')|length }}", R"({"l": ["a"]})"), "t.jinja:1:19: object of type 'generator' has no len()");
  // Integers stay in 64 bits (Python's are unbounded; no template needs more): refused, not wrapped.
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ -9223372036854775807 - 1 }}"), "4611686018427387904 -9223372036854775808");
  EXPECT_EQ(error_of("{{ 2 ** 63 }}"), "t.jinja:1:6: integer overflow in **");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "t.jinja:1:24: integer overflow in +");
  EXPECT_EQ(error_of("{{ 3 ** 1000000000000000000 }}"), "t.jinja:1:6: integer overflow in **");
}

TEST(Jinja, UntrustedTemplatesCannotRunAwayOrOverflowTheStack) {
  EXPECT_NE(error_of("{{" + std::string(300, '(') + "1" + std::string(300, ')') + "}}").find("nested more than 200 deep"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("macros call macros more than 100 deep"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
                .find("more than 2000000 steps"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a' * 1000000000000 }}").find("past 256 MiB"), std::string::npos);
}

TEST(ChatTemplates, FolderTemplateFileWinsOverTheConfigsAndSpecialTokensAreVariables) {
  tessera::testing::TempDir f;  // a tokenizer folder as models publish one
  f.write("tokenizer_config.json", R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
      "chat_template": [{"name": "default", "template": "D{{ bos_token }}"}, {"name": "tool_use", "template": "T{{ eos_token }}"}]})");
  auto plain = ChatTemplate::from_folder(f.path().string());
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->render("[]", {}), "D<s>");
  EXPECT_EQ(ChatTemplate::from_folder(f.path().string(), /*with_tools=*/true)->render("[]", {}), "T</s>");
  f.write("chat_template.jinja", "J{{ eos_token }}{{ extra }}\n");
  ChatOptions options;
  options.variables_json = R"({"extra": "!"})";
  EXPECT_EQ(ChatTemplate::from_folder(f.path().string())->render("[]", options), "J</s>!");
  tessera::testing::TempDir empty;
  EXPECT_FALSE(ChatTemplate::from_folder(empty.path().string()).has_value());
}

// apply_chat_template hands a null content to the template as None; a dataset's rows (every
// column in every row) drop such keys first, as TRL does.
TEST(ChatTemplates, NullKeysReachTheTemplateUnlessTheDatasetDropsThem) {
  const ChatTemplate chat("{{ messages[0].content }}|{{ messages[0] }}", "t.jinja");
  const std::string messages = R"([{"role": "assistant", "content": null}])";
  ChatOptions options;
  EXPECT_EQ(chat.render(messages, options), "None|{'role': 'assistant', 'content': None}");
  options.drop_null_keys = true;
  EXPECT_EQ(chat.render(messages, options), "|{'role': 'assistant'}");
}

TEST(ChatTemplates, AssistantTurnsRunThroughTheEndOfTurnMarker) {
  const ChatTemplate chatml(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      "chatml");
  const auto r = chatml.render_with_targets(
      R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
          {"role": "user", "content": "and?", "name": null}, {"role": "assistant", "content": "done"}])",
      {});
  ASSERT_EQ(r.targets.size(), 2u);
  const auto span = [&](std::size_t i) { return r.text.substr(r.targets[i].begin, r.targets[i].end - r.targets[i].begin); };
  EXPECT_EQ(span(0), "yo<|im_end|>");
  EXPECT_EQ(span(1), "done<|im_end|>");
}

TEST(ChatTemplates, TurnsAreFoundWhereTheTemplateMovesTheSystemPrompt) {
  // Like Mistral's: the system prompt goes into the last user turn, so the prefix changes.
  const ChatTemplate moving(
      "{% set sys = messages | selectattr('role', 'equalto', 'system') | list %}{% set rest = messages | rejectattr('role', 'equalto', 'system') | list %}"
      "{% set users = rest | selectattr('role', 'equalto', 'user') | list %}"
      "<s>{% for m in rest %}{% if m.role == 'user' %}[INST] {% if sys and m == users[-1] %}{{ sys[0].content }}\n\n{% endif %}"
      "{{ m.content }}[/INST]{% else %} {{ m.content }}</s>{% endif %}{% endfor %}",
      "moving");
  const auto r = moving.render_with_targets(
      R"([{"role": "system", "content": "S"}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
          {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}])",
      {});
  EXPECT_EQ(r.text, "<s>[INST] u1[/INST] a1</s>[INST] S\n\nu2[/INST] a2</s>");
  ASSERT_EQ(r.targets.size(), 2u);
  // Both turns as the template writes them after [/INST] (the first found after its user message).
  EXPECT_EQ(r.text.substr(r.targets[0].begin, r.targets[0].end - r.targets[0].begin), " a1</s>");
  EXPECT_EQ(r.text.substr(r.targets[1].begin, r.targets[1].end - r.targets[1].begin), " a2</s>");
}

}  // namespace
