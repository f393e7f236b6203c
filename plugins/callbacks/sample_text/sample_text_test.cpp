// callback/sample_text built through the real loader and factory and driven directly on a small
// byte-level gpt: samples.txt with the prompt first, determinism per seed and step, greedy top_k,
// when it samples, the model's mode and the training RNG left alone, rank 0 only.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/log.hpp"
#include "tessera/components/model.hpp"
#include "test_support.hpp"

namespace tessera {
namespace sample_text_test {

namespace fs = std::filesystem;

// vocab 256: every byte is a token. max_seq_len 8 is shorter than prompt + new tokens, so the
// sampler must slide its context window past the KV cache's.
const char* kModel =
    "model: {component_key: model, variant_key: gpt, config: {vocab_size: 256, n_layer: 1, n_head: 2, n_embd: 16, "
    "max_seq_len: 8, init_std: 0.5}}\n";

struct Sampler {
  testing::TempDir dir;
  RunContext run;
  TrainProgress progress;
  TrainerControl control;
  core::BuiltComponents components;
  std::shared_ptr<Callback> sampler;

  explicit Sampler(const std::string& config, std::int64_t rank = 0) {
    run.run_dir = (dir.path() / "run").string();
    run.seed = 21;
    run.rank = rank;
    // The tokenizer is a shared instance the sampler references, as a run spec would write it.
    const std::string body = config.substr(1, config.size() - 2);
    components = testing::build_components(
        "tok: {component_key: tokenizer, variant_key: bytes}\n"
        "sampler: {component_key: callback, variant_key: sample_text, config: {tokenizer: {instance_key: tok}" +
            (body.find_first_not_of(' ') == std::string::npos ? "" : ", " + body) + "}}\n",
        run);
    sampler = testing::built<Callback>(components, "sampler");
  }

  std::string samples_path() const { return run.run_dir + "/samples.txt"; }

  void step_end(Model& model, std::int64_t step) {
    progress.step = step;
    StepMetrics m;
    m.step = step;
    CallbackContext ctx{run, progress, model, control};
    sampler->on_step_end(ctx, m);
  }
  void train_end(Model& model, std::int64_t step) {
    progress.step = step;
    CallbackContext ctx{run, progress, model, control};
    sampler->on_train_end(ctx);
  }
};

std::shared_ptr<Model> make_model(core::BuiltComponents& keep, std::uint64_t seed = 5) {
  core::seed_everything(seed, "cpu");
  keep = testing::build_components(kModel);
  return testing::built<Model>(keep, "model");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The generated text of the one sample in a samples.txt written at `step`.
std::string only_sample(const std::string& file, std::int64_t step) {
  const std::string header = "--- step " + std::to_string(step) + " ---\n";
  EXPECT_EQ(file.rfind(header, 0), 0u) << file;
  EXPECT_EQ(file.back(), '\n');
  return file.substr(header.size(), file.size() - header.size() - 1);
}

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(SampleText, WritesPromptAndNewTokensToSamplesTxt) {
  core::BuiltComponents keep;
  auto model = make_model(keep);
  Sampler r("{prompt: ab, max_new_tokens: 12}");
  r.train_end(*model, 3);
  ASSERT_TRUE(fs::exists(r.samples_path()));
  const std::string text = only_sample(read_file(r.samples_path()), 3);
  EXPECT_EQ(text.size(), 2u + 12u);  // one byte per token
  EXPECT_EQ(text.substr(0, 2), "ab");
}

TEST(SampleText, SameSeedAndStepGiveTheSameSample) {
  core::BuiltComponents keep;
  auto model = make_model(keep);
  Sampler a("{prompt: ab, max_new_tokens: 12, seed: 3}");
  Sampler b("{prompt: ab, max_new_tokens: 12, seed: 3}");
  Sampler c("{prompt: ab, max_new_tokens: 12, seed: 4}");
  a.train_end(*model, 7);
  b.train_end(*model, 7);
  c.train_end(*model, 7);
  const std::string first = read_file(a.samples_path());
  EXPECT_EQ(read_file(b.samples_path()), first);
  EXPECT_NE(read_file(c.samples_path()), first) << "another seed should sample other text";
  // The run seed is the default.
  Sampler from_run("{prompt: ab, max_new_tokens: 12}");
  Sampler explicit_seed("{prompt: ab, max_new_tokens: 12, seed: 21}");
  from_run.train_end(*model, 7);
  explicit_seed.train_end(*model, 7);
  EXPECT_EQ(read_file(from_run.samples_path()), read_file(explicit_seed.samples_path()));
}

// A model vocabulary padded past the tokenizer's (512 ids for 256 bytes): only the tokenizer's
// ids are drawn, each one byte of text (the bytes tokenizer writes any other id as "<id>").
TEST(SampleText, IdsPastTheTokenizersVocabularyAreNotDrawn) {
  core::seed_everything(5, "cpu");
  core::BuiltComponents keep = testing::build_components(
      "model: {component_key: model, variant_key: gpt, config: {vocab_size: 512, n_layer: 1, n_head: 2, n_embd: 16, "
      "max_seq_len: 8, init_std: 0.5}}\n");
  auto model = testing::built<Model>(keep, "model");
  Sampler r("{prompt: ab, max_new_tokens: 64}");
  r.train_end(*model, 1);
  EXPECT_EQ(only_sample(read_file(r.samples_path()), 1).size(), 2u + 64u);
}

TEST(SampleText, TopKOneIsGreedy) {
  core::BuiltComponents keep;
  auto model = make_model(keep);
  Sampler a("{prompt: ab, max_new_tokens: 12, top_k: 1, seed: 3}");
  Sampler b("{prompt: ab, max_new_tokens: 12, top_k: 1, seed: 4}");
  a.train_end(*model, 1);
  b.train_end(*model, 1);
  const std::string text = only_sample(read_file(a.samples_path()), 1);
  EXPECT_EQ(text, only_sample(read_file(b.samples_path()), 1));

  // The argmax continuation by full forwards: over the whole text while it fits in max_seq_len 8
  // (what the KV cache computes), then over a window of the last 7 tokens sliding.
  std::vector<std::int64_t> tokens = {'a', 'b'};
  model->eval();
  for (int i = 0; i < 12; ++i) {
    const auto start = tokens.size() >= 8 ? tokens.size() - 7 : 0;
    std::vector<std::int64_t> window(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
    at::Tensor input = at::tensor(window, at::kLong).view({1, -1});
    tokens.push_back(model->forward(input)[0][-1].argmax().item<std::int64_t>());
  }
  std::string expected;
  for (auto t : tokens) expected += static_cast<char>(t);
  EXPECT_EQ(text, expected);
}

TEST(SampleText, SamplesEveryNStepsAndOnceMoreAtTrainEnd) {
  core::BuiltComponents keep;
  auto model = make_model(keep);
  Sampler r("{prompt: ab, max_new_tokens: 4, every: 2}");
  for (std::int64_t step = 1; step <= 4; ++step) r.step_end(*model, step);
  r.train_end(*model, 4);  // step 4 was just sampled: not again
  std::string file = read_file(r.samples_path());
  EXPECT_EQ(count(file, "--- step "), 2u) << file;
  EXPECT_EQ(count(file, "--- step 2 ---\nab"), 1u) << file;
  EXPECT_EQ(count(file, "--- step 4 ---\nab"), 1u) << file;
  r.step_end(*model, 5);
  r.train_end(*model, 5);
  file = read_file(r.samples_path());
  EXPECT_EQ(count(file, "--- step "), 3u) << file;
  EXPECT_EQ(count(file, "--- step 5 ---\nab"), 1u) << file;
}

TEST(SampleText, OnlyAtTrainEndByDefault) {
  core::BuiltComponents keep;
  auto model = make_model(keep);
  Sampler r("{prompt: ab, max_new_tokens: 4}");
  for (std::int64_t step = 1; step <= 3; ++step) r.step_end(*model, step);
  EXPECT_FALSE(fs::exists(r.samples_path()));
  r.train_end(*model, 3);
  EXPECT_EQ(count(read_file(r.samples_path()), "--- step 3 ---"), 1u);
}

TEST(SampleText, RestoresTheModelsModeAndLeavesTheTrainingRngAlone) {
  core::BuiltComponents keep;
  auto model = make_model(keep);
  Sampler r("{prompt: ab, max_new_tokens: 6}");
  model->train();
  core::seed_everything(77, "cpu");
  r.train_end(*model, 1);
  EXPECT_TRUE(model->is_training());
  const at::Tensor after_sampling = at::rand({8});
  core::seed_everything(77, "cpu");
  EXPECT_TRUE(at::rand({8}).equal(after_sampling)) << "sampling drew from the global generator";

  model->eval();
  r.train_end(*model, 2);
  EXPECT_FALSE(model->is_training());
}

TEST(SampleText, OnlyRankZeroWritesSamples) {
  core::BuiltComponents keep;
  auto model = make_model(keep);
  Sampler r("{prompt: ab, max_new_tokens: 4, every: 1}", /*rank=*/1);
  r.step_end(*model, 1);
  r.train_end(*model, 2);
  EXPECT_FALSE(fs::exists(r.samples_path()));
}

TEST(SampleText, PromptOutsideTheVocabularyIsSkippedWithAWarning) {
  auto b = testing::build_components(
      "model: {component_key: model, variant_key: gpt, config: {vocab_size: 64, n_layer: 1, n_head: 1, n_embd: 8, max_seq_len: 8}}\n");
  auto model = testing::built<Model>(b, "model");
  Sampler r("{prompt: a, max_new_tokens: 4}");  // 'a' is 97
  log::set_level(log::Level::info);
  ::testing::internal::CaptureStderr();
  r.train_end(*model, 1);
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("outside the model's vocabulary"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(r.samples_path()));
}

TEST(SampleText, EmptyPromptIsAConfigIssue) {
  try {
    Sampler r("{prompt: ''}");
    FAIL() << "expected a ConfigIssue";
  } catch (const core::ConfigIssue& e) {
    EXPECT_EQ(e.path(), "components.sampler.config.prompt");
  }
}

}  // namespace sample_text_test
}  // namespace tessera
