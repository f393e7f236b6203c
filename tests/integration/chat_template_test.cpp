// Chat templates against transformers itself (tools/interop/chat_template_reference.py, in .venv):
// Tessera's Jinja interpreter renders a table of Jinja cases as transformers' Jinja environment
// does; the templates published with Llama 3.1, Qwen2.5, Qwen3, Mistral, DeepSeek-V3 and Gemma 3
// give apply_chat_template's text and token ids through dataset/sft_jsonl (system prompts,
// several turns, tools where the template has them, the generation prompt); with {% generation %}
// blocks the targets are exactly transformers' assistant mask; `tessera eval` of an SFT set
// written with the model folder's template gives transformers' cross-entropy over that mask; and
// every template published with today's open models (tests/fixtures/chat_templates/published/)
// renders every kind of conversation as transformers does, or refuses where it refuses.
#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "reference_process.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/run/batch.hpp"
#include "tessera/text/chat_template.hpp"
#include "tessera/text/jinja.hpp"
#include "test_support.hpp"

namespace tessera {
namespace chat_template_test {

using nlohmann::ordered_json;

class ChatTemplateInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::python_has(python_, {"transformers", "jinja2"})) {
      GTEST_SKIP() << "transformers is not installed in .venv (tools/setup.sh installs it)";
    }
  }

  // chat_template_reference.py ARGS; fails the test unless it exits 0; returns stdout.
  std::string reference(const std::string& args) {
    std::string out;
    const int rc = run_command("(" + python_ + " " + testing::source_dir() + "/tools/interop/chat_template_reference.py " +
                                   args + " 2>" + dir_.file("python.err") + ")",
                               out);
    std::string err;
    run_command("cat " + dir_.file("python.err"), err);
    EXPECT_EQ(rc, 0) << args << "\n" << out << err;
    return out;
  }

  static ordered_json read_json(const std::string& path) {
    std::ifstream in(path);
    return ordered_json::parse(in);
  }

  static std::string fixture(const std::string& name) {
    return testing::source_dir() + "/tests/fixtures/chat_templates/" + name;
  }

  const std::string python_ = testing::source_dir() + "/.venv/bin/python3";
  testing::TempDir dir_;
};

TEST_F(ChatTemplateInterop, JinjaCasesRenderAsTransformersJinjaEnvironment) {
  const std::string cases_path = testing::source_dir() + "/tests/fixtures/jinja/cases.json";
  reference("jinja " + cases_path + " " + dir_.file("expected.json"));
  const ordered_json cases = read_json(cases_path), expected = read_json(dir_.file("expected.json"));
  ASSERT_EQ(cases.size(), expected.size());
  int errors = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string source = cases[i]["template"].get<std::string>();
    SCOPED_TRACE("case " + std::to_string(i) + ": " + source);
    std::string text, error;
    std::vector<text::TextSpan> spans;
    try {
      const auto out = text::JinjaTemplate(source, "case.jinja").render(cases[i]["context"].dump());
      text = out.text;
      spans = out.generation;
    } catch (const tessera::Error& e) {
      error = e.what();
    }
    if (expected[i].contains("error")) {
      ++errors;
      EXPECT_FALSE(error.empty()) << "transformers: " << expected[i]["error"] << "; Tessera rendered " << text;
      EXPECT_EQ(error.rfind("case.jinja:", 0), 0u) << error;  // positioned
      continue;
    }
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_EQ(text, expected[i]["text"].get<std::string>());
    std::vector<text::TextSpan> want;
    for (const auto& s : expected[i]["generation"]) want.push_back({s[0].get<std::size_t>(), s[1].get<std::size_t>()});
    EXPECT_EQ(spans, want);
  }
  EXPECT_GE(errors, 10);  // the table's error cases still fail in transformers too
}

// Conversations for one template: a plain exchange, a system prompt and several turns, tool calls
// and results (where the template takes tools), reasoning (Qwen3), each with and without the
// generation prompt (then ending on a user turn after an assistant one).
ordered_json conversations(const std::string& name) {
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string",
      "description": "the city"}, "days": {"type": "integer"}}, "required": ["city"]}}}])");
  std::vector<ordered_json> chats = {
      ordered_json::parse(R"([{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
          {"role": "user", "content": "Nothing."}, {"role": "assistant", "content": "Fine."}])"),
      ordered_json::parse(R"([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3 ünïcode?"},
          {"role": "assistant", "content": "6 — sure"}])")};
  if (name != "gemma-3.jinja") {
    chats.push_back(ordered_json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 degrees."}, {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You are welcome."}])"));
  }
  if (name == "qwen3.jinja") {
    chats.push_back(ordered_json::parse(R"([{"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nreason one\n</think>\n\nA1"}, {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "reasoning_content": "reason two"}])"));
  }
  ordered_json cases = ordered_json::array();
  for (const auto& chat : chats) {
    const bool with_tools = chat.dump().find("tool_calls") != std::string::npos;
    for (const bool generation_prompt : {false, true}) {
      ordered_json c;
      c["messages"] = chat;
      if (generation_prompt) c["messages"].erase(c["messages"].size() - 1);
      if (with_tools) c["tools"] = tools;
      c["add_generation_prompt"] = generation_prompt;
      c["extra"] = {{"date_string", "26 Jul 2024"}};
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<std::int64_t> row_of(const at::Tensor& t, std::int64_t i) {
  const at::Tensor r = t[i].contiguous();
  return {r.const_data_ptr<std::int64_t>(), r.const_data_ptr<std::int64_t>() + r.numel()};
}

TEST_F(ChatTemplateInterop, PublishedTemplatesGiveTransformersTextIdsAndAssistantMasks) {
  for (const std::string name : {"llama-3.1.jinja", "qwen2.5.jinja", "qwen3.jinja", "mistral.jinja", "deepseek-v3.jinja",
                                 "gemma-3.jinja", "qwen2.5-generation.jinja"}) {
    SCOPED_TRACE(name);
    const std::string folder = dir_.file(name + ".tokenizer");
    reference("make-tokenizer " + fixture(name) + " " + folder);
    const ordered_json cases = conversations(name);
    std::ofstream(dir_.file("cases.json")) << cases.dump();
    reference("chat " + folder + " " + dir_.file("cases.json") + " " + dir_.file("expected.json"));
    const ordered_json expected = read_json(dir_.file("expected.json"));
    ASSERT_EQ(expected.size(), cases.size());

    // The text: ChatTemplate as dataset/sft_jsonl finds it in the tokenizer folder.
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto chat = text::ChatTemplate::from_folder(folder, cases[i].contains("tools"));
      ASSERT_TRUE(chat.has_value());
      text::ChatOptions options;
      options.add_generation_prompt = cases[i]["add_generation_prompt"].get<bool>();
      options.tools_json = cases[i].contains("tools") ? cases[i]["tools"].dump() : "";
      options.variables_json = cases[i]["extra"].dump();
      EXPECT_EQ(chat->render(cases[i]["messages"].dump(), options), expected[i]["text"].get<std::string>()) << "case " << i;
    }

    // The ids and targets: dataset/sft_jsonl with chat_template auto, one row per chat.
    for (const bool generation_prompt : {false, true}) {
      std::string lines;
      std::vector<std::size_t> which;
      for (std::size_t i = 0; i < cases.size(); ++i) {
        if (cases[i]["add_generation_prompt"].get<bool>() != generation_prompt) continue;
        ordered_json row = {{"messages", cases[i]["messages"]}};
        if (cases[i].contains("tools")) row["tools"] = cases[i]["tools"];
        lines += row.dump() + "\n";
        which.push_back(i);
      }
      const std::string data = dir_.write("chats.jsonl", lines);
      auto built = testing::build_components(
          "data: {component_key: dataset, variant_key: sft_jsonl, config: {path: " + data +
          ", tokenizer: {component_key: tokenizer, variant_key: bpe, config: {path: " + folder +
          "}}, seq_len: 4096, pack: false, shuffle: false, add_generation_prompt: " + (generation_prompt ? "true" : "false") +
          ", template_variables: ['date_string=26 Jul 2024']}}\n"
          "tok: {component_key: tokenizer, variant_key: bpe, config: {path: " + folder + "}}\n");
      auto dataset = testing::built<Dataset>(built, "data");
      auto tokenizer = testing::built<Tokenizer>(built, "tok");
      dataset->set_shard(0, 1);
      ASSERT_EQ(dataset->num_samples(), static_cast<std::int64_t>(which.size()));
      const Batch batch = dataset->next_batch(static_cast<std::int64_t>(which.size()));
      for (std::size_t r = 0; r < which.size(); ++r) {
        SCOPED_TRACE("case " + std::to_string(which[r]));
        const ordered_json& want = expected[which[r]];
        const auto ids = want["ids"].get<std::vector<std::int64_t>>();
        const auto inputs = row_of(batch.input_ids, static_cast<std::int64_t>(r));
        const auto labels = row_of(batch.labels, static_cast<std::int64_t>(r));
        ASSERT_LT(ids.size(), inputs.size());
        EXPECT_EQ(std::vector<std::int64_t>(inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(ids.size() - 1)),
                  std::vector<std::int64_t>(ids.begin(), ids.end() - 1));
        if (want.contains("assistant_masks")) {
          // {% generation %} blocks: the targets are transformers' assistant mask, token for token.
          const auto mask = want["assistant_masks"].get<std::vector<int>>();
          for (std::size_t k = 0; k + 1 < ids.size(); ++k) {
            EXPECT_EQ(labels[k], mask[k + 1] ? ids[k + 1] : kIgnoreIndex) << "position " << k;
          }
        } else {
          // Each assistant turn through its end-of-turn marker: every assistant content is in the
          // targets' text, no user content is.
          std::vector<std::int64_t> target_ids;
          for (std::size_t k = 0; k + 1 < ids.size(); ++k) {
            if (labels[k] != kIgnoreIndex) target_ids.push_back(labels[k]);
          }
          const std::string targets = tokenizer->decode(target_ids);
          for (const auto& m : cases[which[r]]["messages"]) {
            const std::string content = m.value("content", "");
            if (content.empty() || content.rfind("<think>", 0) == 0) continue;  // Qwen3 rewrites reasoning
            const bool assistant = m.value("role", "") == "assistant";
            EXPECT_EQ(targets.find(content) != std::string::npos, assistant) << m.dump() << " in " << targets;
          }
        }
      }
    }
  }
}

// `tessera generate` renders a messages row with the folder's template and its generation prompt
// and encodes it as transformers' apply_chat_template(tokenize=True) does (the template's own BOS
// once, whatever the tokenizer adds to plain text).
TEST_F(ChatTemplateInterop, GenerateEncodesMessagesAsApplyChatTemplateWithTheGenerationPrompt) {
  for (const std::string name : {"llama-3.1.jinja", "qwen2.5.jinja"}) {
    SCOPED_TRACE(name);
    const std::string folder = dir_.file(name + ".model");
    reference("make-tokenizer " + fixture(name) + " " + folder);
    std::string out;
    ASSERT_EQ(run_command(python_ + " " + testing::source_dir() + "/tools/interop/hf_reference.py make-qwen2 " +
                              folder + " --vocab 2000 --positions 512 --tied",
                          out),
              0)
        << out;
    ordered_json cases = ordered_json::array();
    std::string lines;
    for (const auto& c : conversations(name)) {
      // (every case's date_string is llama-3.1's own default, which generate leaves to the template)
      if (!c["add_generation_prompt"].get<bool>() || c.contains("tools")) continue;
      cases.push_back(c);
      lines += ordered_json{{"messages", c["messages"]}}.dump() + "\n";
    }
    ASSERT_GE(cases.size(), 2u);
    std::ofstream(dir_.file("cases.json")) << cases.dump();
    reference("chat " + folder + " " + dir_.file("cases.json") + " " + dir_.file("expected.json"));
    const ordered_json expected = read_json(dir_.file("expected.json"));
    const std::string spec = dir_.write(
        "generate.yaml", "plugins: {paths: [" + testing::plugin_dir() + "]}\ncomponents:\n"
                         "  model: {component_key: model, variant_key: qwen2, config: {init_from: " + folder + "}}\n"
                         "  tokenizer: {component_key: tokenizer, variant_key: bpe, config: {path: " + folder + "}}\n");
    ASSERT_EQ(run_command("(" + testing::tessera_binary() + " generate " + spec + " --prompts " +
                              dir_.write("prompts.jsonl", lines) + " --max-new-tokens 1 --temperature 0 2>/dev/null)",
                          out),
              0)
        << out;
    std::istringstream rows(out);
    std::size_t i = 0;
    for (std::string line; std::getline(rows, line); ++i) {
      ASSERT_LT(i, expected.size());
      EXPECT_EQ(ordered_json::parse(line)["prompt_ids"], expected[i]["ids"]) << "case " << i;
    }
    EXPECT_EQ(i, expected.size());
  }
}

TEST_F(ChatTemplateInterop, SftEvalWithTheFoldersTemplateGivesTransformersLossOverTheAssistantMask) {
  const std::string folder = dir_.file("qwen2");
  reference("make-tokenizer " + fixture("qwen2.5-generation.jinja") + " " + folder);
  std::string out;
  ASSERT_EQ(run_command(python_ + " " + testing::source_dir() + "/tools/interop/hf_reference.py make-qwen2 " + folder +
                            " --vocab 400 --positions 256 --tied",
                        out),
            0)
      << out;
  std::string lines;
  const ordered_json chats = conversations("qwen2.5-generation.jinja");
  for (const auto& c : chats) {
    if (c["add_generation_prompt"].get<bool>()) continue;
    ordered_json row = {{"messages", c["messages"]}};
    lines += row.dump() + "\n";
  }
  const std::string data = dir_.write("chats.jsonl", lines);
  const std::string spec = dir_.write(
      "sft.yaml", "name: sft\nplugins: {paths: [" + testing::plugin_dir() + "]}\n" +
                      "settings: {seed: 1, run_dir: " + dir_.file("runs/sft") + ", device: cpu}\n" +
                      "components:\n  model: {component_key: model, variant_key: qwen2, config: {init_from: " + folder +
                      "}}\n  train_data: {component_key: dataset, variant_key: sft_jsonl, config: {path: " + data +
                      ", tokenizer: {component_key: tokenizer, variant_key: bpe, config: {path: " + folder +
                      "}}, seq_len: 256, pack: false, shuffle: false, chat_template: auto}}\n" +
                      "  loss: {component_key: loss, variant_key: cross_entropy}\n" +
                      "  optimizer: {component_key: optimizer, variant_key: adamw, config: {lr: 1.0e-3, "
                      "model: {instance_key: model, pass_type: BY_REFERENCE}}}\n" +
                      "trainer: {max_steps: 1, micro_batch_size: 3}\n");
  ASSERT_EQ(run_command("(" + testing::tessera_binary() + " eval " + spec + " --split train --batches 1 2>/dev/null)", out), 0)
      << out;
  const auto tessera = nlohmann::json::parse(out.substr(out.rfind('{')));
  const auto transformers = nlohmann::json::parse(reference("sft-loss " + folder + " " + folder + " " + data));
  EXPECT_EQ(tessera.value("tokens", -1.0), transformers["targets"].get<double>()) << out;
  const double expected = transformers["loss"].get<double>();
  EXPECT_LT(std::abs(tessera["loss"].get<double>() - expected) / expected, 1e-5) << out;
}

// Every published template under every kind of conversation (system prompts, several turns, tool
// calls with object and with JSON-string arguments, tool replies, reasoning, typed content parts,
// Llama's builtin_tools), with and without the generation prompt: Tessera writes transformers'
// text byte for byte, or refuses where transformers refuses. A template that crashed the process
// once (a filter handed a string for a dict) would end this test too.
TEST_F(ChatTemplateInterop, PublishedTemplatesRenderEveryConversationAsTransformersDoes) {
  namespace fs = std::filesystem;
  const ordered_json conversations = read_json(fixture("conversations.json"));
  const ordered_json special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"pad_token", "<pad>"},
                                       {"unk_token", "<unk>"}};
  ordered_json cases = {{"templates", ordered_json::object()}, {"special_tokens", special_tokens},
                        {"conversations", conversations}};
  std::vector<std::string> names;
  for (const std::string folder : {fixture(""), fixture("published")}) {
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.path().extension() != ".jinja") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string source{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      const std::string name = entry.path().filename().string();
      if (cases["templates"].contains(name)) continue;
      cases["templates"][name] = source;
      names.push_back(name);
    }
  }
  ASSERT_GE(names.size(), 30u) << "the published templates are missing from " << fixture("published");
  std::ofstream(dir_.file("published.json")) << cases.dump();
  reference("published " + dir_.file("published.json") + " " + dir_.file("expected.json"));
  const ordered_json expected = read_json(dir_.file("expected.json"));

  int equal_texts = 0, both_refuse = 0;
  for (const auto& name : names) {
    const text::ChatTemplate chat(cases["templates"][name].get<std::string>(), name, special_tokens.dump());
    for (std::size_t i = 0; i < conversations.size(); ++i) {
      const ordered_json& c = conversations[i];
      SCOPED_TRACE(name + ", conversation " + std::to_string(i) + " (" + c["kind"].get<std::string>() +
                   (c["add_generation_prompt"].get<bool>() ? ", generation prompt)" : ")"));
      text::ChatOptions options;
      options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
      options.tools_json = c.contains("tools") ? c["tools"].dump() : "";
      options.variables_json = c["extra"].dump();
      std::string text, error;
      try {
        text = chat.render(c["messages"].dump(), options);
      } catch (const tessera::Error& e) {
        error = e.what();
      }
      const ordered_json& want = expected[name][i];
      if (want.contains("error")) {
        EXPECT_FALSE(error.empty()) << "transformers refused (" << want["error"] << "), Tessera rendered:\n" << text;
        EXPECT_EQ(error.rfind(name + ":", 0), 0u) << "an error names the template and the position: " << error;
        both_refuse += !error.empty();
        continue;
      }
      EXPECT_TRUE(error.empty()) << error;
      EXPECT_EQ(text, want["text"].get<std::string>());
      equal_texts += error.empty() && text == want["text"].get<std::string>();
    }
  }
  std::cout << names.size() << " templates x " << conversations.size() << " conversations: " << equal_texts
            << " texts equal to transformers', " << both_refuse << " refused by both\n";
}

}  // namespace chat_template_test
}  // namespace tessera
