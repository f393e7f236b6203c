// Generation against transformers itself: for a tiny random model of every family made in Python
// (tools/interop/hf_reference.py) and imported by init_from, tessera::generate's greedy
// completions of three prompts of different lengths, left-padded into one batch through the KV
// cache, equal transformers' `generate(do_sample=False)` of each prompt alone, token for token:
// gpt2, llama, qwen2 and gemma3_text with sliding windows shorter than the text, qwen3,
// qwen3_moe and deepseek_v3 (latent attention).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "hf_fixture.hpp"
#include "tessera/components/model.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/generation/generate.hpp"
#include "test_support.hpp"

namespace tessera {
namespace generate_interop_test {

struct Family {
  const char* variant;  // Tessera's
  const char* make;     // hf_reference.py's command and flags
};

class GenerateInterop : public HfInterop {};

TEST_F(GenerateInterop, GreedyBatchesEqualTransformersGenerateForEveryFamily) {
  const std::vector<std::vector<std::int64_t>> prompts = {
      {5, 17, 200, 31, 9}, {88, 1, 42, 42, 250, 7, 63, 120, 3}, {99, 100, 101}};
  const std::int64_t new_tokens = 8;
  const std::vector<Family> families = {
      {"gpt", "make-gpt2"},
      {"llama", "make-llama --kv-heads 2"},
      {"qwen2", "make-qwen2 --window 4 --max-window-layers 1"},
      {"qwen3", "make-qwen3"},
      {"qwen3_moe", "make-qwen3-moe --dense-blocks 0"},
      {"deepseek_v3", "make-deepseek-v3"},
      {"gemma3_text", "make-gemma3 --window 4"},
  };
  for (const Family& f : families) {
    SCOPED_TRACE(f.variant);
    const std::string folder = dir_.file(std::string("hf_") + f.variant);
    const std::string command = f.make;
    reference(command.substr(0, command.find(' ')) + " " + folder +
              (command.find(' ') == std::string::npos ? "" : command.substr(command.find(' '))));
    core::seed_everything(1, "cpu");
    const auto built = testing::build_components("model: {component_key: model, variant_key: " +
                                                 std::string(f.variant) + ", config: {init_from: " + folder + "}}\n");
    const auto model = testing::built<Model>(built, "model");
    std::vector<GenerationRequest> requests;
    for (const auto& p : prompts) {
      GenerationRequest r;
      r.prompt_ids = p;
      r.sampling.temperature = 0;
      r.max_new_tokens = new_tokens;
      requests.push_back(r);
    }
    GenerationOptions options;
    options.batch_size = 3;
    const std::vector<GenerationResult> ours = generate(*model, requests, options);
    const std::string line = reference("generate " + folder + " --prompts " + nlohmann::json(prompts).dump() +
                                       " --max-new " + std::to_string(new_tokens));  // no spaces in it
    const auto theirs = nlohmann::json::parse(line).get<std::vector<std::vector<std::int64_t>>>();
    ASSERT_EQ(theirs.size(), prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(ours[i].completion_ids, theirs[i]) << "prompt " << i;
    }
  }
}

}  // namespace generate_interop_test
}  // namespace tessera
