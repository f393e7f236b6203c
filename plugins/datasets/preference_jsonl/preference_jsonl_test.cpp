// dataset/preference_jsonl built through the real loader and factory with the byte tokenizer:
// a pair is two rows (chosen, rejected) sharing the prompt's tokens, only completions are targets,
// a batch counts its pairs; messages are written with a chat template and the completion is what
// the template writes after the prompt's generation prompt; prompts are cut from the left to fit;
// the position resumes; bad lines and odd micro-batches are clear errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/run/batch.hpp"
#include "test_support.hpp"

namespace tessera {
namespace preference_jsonl_test {

constexpr std::int64_t I = kIgnoreIndex;

std::shared_ptr<Dataset> make(const std::string& path, const std::string& extra) {
  auto b = testing::build_components(
      "data: {component_key: dataset, variant_key: preference_jsonl, config: {path: " + path +
      ", tokenizer: {component_key: tokenizer, variant_key: bytes}" +
      (extra.find("shuffle") == std::string::npos ? ", shuffle: false" : "") + extra + "}}\n");
  auto data = testing::built<Dataset>(b, "data");
  data->set_shard(0, 1);
  return data;
}

std::vector<std::int64_t> row(const at::Tensor& t, std::int64_t i) {
  const at::Tensor r = t[i].contiguous();
  return {r.data_ptr<std::int64_t>(), r.data_ptr<std::int64_t>() + r.numel()};
}

std::vector<std::int64_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(PreferenceJsonl, APairIsTwoRowsSharingThePromptAndOnlyCompletionsAreTargets) {
  testing::TempDir dir;
  const std::string path = dir.write("p.jsonl", R"({"prompt": "ab", "chosen": "cd", "rejected": "x"})" "\n"
                                                R"({"prompt": "q", "chosen": "y", "rejected": "zz"})" "\n");
  auto data = make(path, ", seq_len: 5");
  EXPECT_EQ(data->num_samples(), 4);  // rows
  const Batch batch = data->next_batch(4);
  EXPECT_EQ(batch.num_target_tokens, 2) << "a batch counts its pairs";
  // Pair 0: a b | c d (chosen), a b | x (rejected); the byte tokenizer has no BOS or EOS.
  EXPECT_EQ(row(batch.input_ids, 0), (std::vector<std::int64_t>{'a', 'b', 'c', 0, 0}));
  EXPECT_EQ(row(batch.labels, 0), (std::vector<std::int64_t>{I, 'c', 'd', I, I}));
  EXPECT_EQ(row(batch.input_ids, 1), (std::vector<std::int64_t>{'a', 'b', 0, 0, 0}));
  EXPECT_EQ(row(batch.labels, 1), (std::vector<std::int64_t>{I, 'x', I, I, I}));
  EXPECT_EQ(row(batch.labels, 2), (std::vector<std::int64_t>{'y', I, I, I, I}));
  EXPECT_EQ(row(batch.labels, 3), (std::vector<std::int64_t>{'z', 'z', I, I, I}));
  try {
    data->next_batch(3);
    FAIL() << "an odd micro-batch";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be even, got 3 (trainer.micro_batch_size)"), std::string::npos) << e.what();
  }
}

TEST(PreferenceJsonl, MessagesAreWrittenWithTheTemplateAndTheCompletionIsWhatFollowsThePrompt) {
  testing::TempDir dir;
  const std::string tpl = dir.write(
      "chatml.jinja",
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}");
  const std::string path = dir.write(
      "p.jsonl",
      R"({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], "chosen": [{"role": "assistant", "content": "good"}], "rejected": "bad"})"
      "\n");
  auto data = make(path, ", seq_len: 64, chat_template: " + tpl);
  const Batch batch = data->next_batch(2);
  const std::string prompt = "<system>S</s><user>Q</s><assistant>";
  for (const auto& [r, completion] : {std::pair<std::int64_t, std::string>{0, "good</s>"}, {1, "bad</s>"}}) {
    const std::string text = prompt + completion;
    const auto inputs = row(batch.input_ids, r), labels = row(batch.labels, r);
    EXPECT_EQ(std::vector<std::int64_t>(inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(text.size() - 1)),
              bytes(text.substr(0, text.size() - 1)));
    for (std::size_t i = 0; i + 1 < text.size(); ++i) {
      EXPECT_EQ(labels[i], i + 1 >= prompt.size() ? static_cast<std::int64_t>(text[i + 1]) : I) << "row " << r << " position " << i;
    }
  }
}

TEST(PreferenceJsonl, PromptsAreCutFromTheLeftThenCompletionsAtTheEnd) {
  testing::TempDir dir;
  const std::string path = dir.write("p.jsonl", R"({"prompt": "abcdefgh", "chosen": "XYZ", "rejected": "W"})" "\n"
                                                R"({"prompt": "p", "chosen": "0123456789", "rejected": "r"})" "\n");
  auto data = make(path, ", seq_len: 5");
  const Batch batch = data->next_batch(4);
  // 5 + 1 tokens fit: the longer completion XYZ (3) leaves the prompt's last 3, fgh, to both rows.
  EXPECT_EQ(row(batch.input_ids, 0), (std::vector<std::int64_t>{'f', 'g', 'h', 'X', 'Y'}));
  EXPECT_EQ(row(batch.labels, 0), (std::vector<std::int64_t>{I, I, 'X', 'Y', 'Z'}));
  EXPECT_EQ(row(batch.input_ids, 1), (std::vector<std::int64_t>{'f', 'g', 'h', 0, 0}));
  // A completion longer than a row keeps one prompt token and its own first 5.
  EXPECT_EQ(row(batch.input_ids, 2), (std::vector<std::int64_t>{'p', '0', '1', '2', '3'}));
  EXPECT_EQ(row(batch.labels, 2), (std::vector<std::int64_t>{'0', '1', '2', '3', '4'}));
  auto limited = make(path, ", seq_len: 16, max_prompt_length: 2, max_completion_length: 2");
  const Batch b = limited->next_batch(2);
  EXPECT_EQ(row(b.input_ids, 0), (std::vector<std::int64_t>{'g', 'h', 'X', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(PreferenceJsonl, ThePositionResumesAndBadLinesArePositioned) {
  testing::TempDir dir;
  std::string lines;
  for (int i = 0; i < 5; ++i) lines += R"({"prompt": "p)" + std::to_string(i) + R"(", "chosen": "c", "rejected": "r"})" "\n";
  const std::string path = dir.write("p.jsonl", lines);
  auto first = make(path, ", seq_len: 4, shuffle: true, seed: 3");
  first->next_batch(2);
  first->next_batch(4);
  const StateDict state = first->state_dict();
  const Batch expected = first->next_batch(4);
  auto resumed = make(path, ", seq_len: 4, shuffle: true, seed: 3");
  resumed->load_state_dict(state);
  EXPECT_TRUE(at::equal(resumed->next_batch(4).input_ids, expected.input_ids));
  auto other = make(path, ", seq_len: 5, shuffle: true, seed: 3");
  EXPECT_THROW(other->load_state_dict(state), tessera::Error);

  const std::string bad = dir.write("bad.jsonl", R"({"prompt": "p", "chosen": "c", "rejected": "r"})" "\n" R"({"prompt": "p", "chosen": "c"})" "\n");
  try {
    make(bad, ", seq_len: 4");
    FAIL() << "a line without 'rejected'";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: no field 'rejected'"), std::string::npos) << e.what();
  }
}

}  // namespace preference_jsonl_test
}  // namespace tessera
