// dataset/prompt_jsonl built through the real loader and factory: text prompts as the tokenizer
// encodes them, messages with a published chat template's generation prompt (and sft_jsonl's
// plain lines without one), the other fields kept for the rewards, max_prompt_length keeping the
// end, a seeded order over disjoint shards, and a resumed position.
#include <ATen/ops/scalar_tensor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "tessera/components/dataset.hpp"
#include "tessera/components/prompt_source.hpp"
#include "tessera/error.hpp"
#include "tessera/text/chat_template.hpp"
#include "test_support.hpp"

namespace tessera {
namespace prompt_jsonl_test {

std::vector<std::int64_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

struct Built {
  core::BuiltComponents keep;
  std::shared_ptr<Dataset> dataset;
  PromptSource* prompts = nullptr;
};

Built build(const std::string& path, const std::string& extra = "") {
  Built b;
  RunContext run;
  run.seed = 5;
  b.keep = testing::build_components("d: {component_key: dataset, variant_key: prompt_jsonl, config: {path: " + path +
                                         ", tokenizer: {component_key: tokenizer, variant_key: bytes}" + extra + "}}\n",
                                     run);
  b.dataset = testing::built<Dataset>(b.keep, "d");
  b.prompts = b.dataset->prompts();
  return b;
}

class PromptJsonl : public ::testing::Test {
 protected:
  std::string rows() {
    return dir_.write("prompts.jsonl",
                      "{\"prompt\": \"What is 2+3?\", \"answer\": \"5\", \"level\": 1}\n"
                      "\n"
                      "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                      "\"content\": \"7*6?\"}], \"answer\": 42}\n"
                      "{\"prompt\": \"Say hi\", \"answer\": null}\n");
  }
  testing::TempDir dir_;
};

TEST_F(PromptJsonl, TextAndPlainMessagesWithTheirRowsInFileOrder) {
  Built b = build(rows(), ", shuffle: false");
  ASSERT_NE(b.prompts, nullptr) << "a prompt dataset gives its prompts";
  b.dataset->set_shard(0, 1);
  EXPECT_EQ(b.dataset->num_samples(), 3);
  const std::vector<Prompt> p = b.prompts->next_prompts(4);  // an epoch and one more
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].ids, bytes_of("What is 2+3?"));
  EXPECT_EQ(p[0].text, "What is 2+3?");
  EXPECT_EQ(p[0].row, (nlohmann::json{{"answer", "5"}, {"level", 1}}));
  // No template: sft_jsonl's lines, then the assistant's turn to answer.
  EXPECT_EQ(p[1].ids, bytes_of("system: Be brief.\nuser: 7*6?\nassistant: "));
  EXPECT_EQ(p[1].row, (nlohmann::json{{"answer", 42}}));
  EXPECT_EQ(p[2].row, (nlohmann::json{{"answer", nullptr}}));
  EXPECT_EQ(p[1].index, 1);
  EXPECT_EQ(p[3].index, 0) << "the next epoch begins again";
  EXPECT_THROW(b.dataset->next_batch(2), Error) << "no token batches: prompts are for loss/grpo";
}

TEST_F(PromptJsonl, MessagesEndWithTheTemplatesGenerationPrompt) {
  const std::string jinja = testing::source_dir() + "/tests/fixtures/chat_templates/qwen2.5.jinja";
  Built b = build(rows(), ", shuffle: false, chat_template: " + jinja);
  b.dataset->set_shard(0, 1);
  const auto p = b.prompts->next_prompts(2);
  const auto chat = text::ChatTemplate::from_path(jinja, "");
  text::ChatOptions options;
  options.add_generation_prompt = true;
  const std::string expected =
      chat.render(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "7*6?"}])", options);
  ASSERT_NE(expected.find("<|im_start|>assistant\n"), std::string::npos) << expected;
  EXPECT_EQ(p[1].text, expected);
  EXPECT_EQ(p[1].ids, bytes_of(expected));
  EXPECT_EQ(p[0].ids, bytes_of("What is 2+3?")) << "a text prompt is not templated (TRL's standard format)";
  EXPECT_THROW(build(rows(), ", add_generation_prompt: false"), ConfigError);
}

TEST_F(PromptJsonl, MaxPromptLengthKeepsTheEnd) {
  Built b = build(rows(), ", shuffle: false, max_prompt_length: 4");
  b.dataset->set_shard(0, 1);
  const auto p = b.prompts->next_prompts(1);
  EXPECT_EQ(p[0].ids, bytes_of("2+3?"));
  EXPECT_EQ(p[0].text, "2+3?");
  EXPECT_EQ(b.dataset->seq_len(), 4);
}

TEST_F(PromptJsonl, ShardsAreDisjointAndAResumedPositionGoesOn) {
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += "{\"prompt\": \"p" + std::to_string(i) + "\", \"i\": " + std::to_string(i) + "}\n";
  const std::string path = dir_.write("ten.jsonl", lines);
  std::set<std::int64_t> seen;
  for (std::int64_t rank = 0; rank < 2; ++rank) {
    Built b = build(path);
    b.dataset->set_shard(rank, 2);
    for (const auto& p : b.prompts->next_prompts(5)) {
      EXPECT_TRUE(seen.insert(p.index).second) << "prompt " << p.index << " on two ranks";
      EXPECT_EQ(p.row.at("i").get<std::int64_t>(), p.index);
    }
  }
  EXPECT_EQ(seen.size(), 10u) << "the two shards cover the epoch";
  Built a = build(path);
  a.dataset->set_shard(0, 1);
  const auto first = a.prompts->next_prompts(13);
  std::vector<std::int64_t> order;
  for (const auto& p : first) order.push_back(p.index);
  EXPECT_NE(std::vector<std::int64_t>(order.begin(), order.begin() + 10),
            (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}))
      << "shuffled with the run's seed";
  // Saved after 13, a new instance goes on with the 14th.
  const StateDict state = a.dataset->state_dict();
  const auto next = a.prompts->next_prompts(4);
  Built resumed = build(path);
  resumed.dataset->set_shard(0, 1);
  resumed.dataset->load_state_dict(state);
  const auto again = resumed.prompts->next_prompts(4);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(again[i].index, next[i].index);
  // A position saved over other prompts is refused.
  Built other = build(path, ", max_prompt_length: 1");
  EXPECT_THROW(other.dataset->load_state_dict(state), Error);
}

TEST_F(PromptJsonl, ARowWithoutAPromptNamesItsLine) {
  try {
    build(dir_.write("bad.jsonl", "{\"prompt\": \"ok\"}\n{\"question\": \"no prompt\"}\n"));
    FAIL() << "a row without a prompt was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: no field 'prompt'"), std::string::npos) << e.what();
  }
}

}  // namespace prompt_jsonl_test
}  // namespace tessera
