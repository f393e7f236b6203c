// Generation (tessera/generation/): greedy completions of prompts of different lengths, batched
// two at a time through the KV cache, equal the argmax of full forwards token by token, with each
// token's log-probability the full forward's log-softmax (1e-5), for gpt, llama and deepseek_v3;
// an EOS ends a request with it. Sampling: a fixed seed reproduces; top_k, top_p and min_p keep
// exactly the tokens their definitions allow and every draw lies among them; the frequencies of
// 4000 draws match the tempered distribution (chi-square, fixed seeds); bad requests are refused
// naming the request.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "tessera/components/model.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/error.hpp"
#include "tessera/generation/generate.hpp"
#include "tessera/generation/sampling.hpp"

namespace tessera {
namespace generate_test {

std::shared_ptr<Model> build(const std::string& config) {
  core::seed_everything(7, "cpu");
  return testing::built<Model>(testing::build_components("model: " + config + "\n"), "model");
}

std::vector<std::string> models() {
  return {"{component_key: model, variant_key: gpt, config: {vocab_size: 64, n_layer: 2, n_head: 4, n_embd: 32, "
          "max_seq_len: 32}}",
          "{component_key: model, variant_key: llama, config: {vocab_size: 64, n_layer: 2, n_head: 4, n_kv_head: 2, "
          "n_embd: 32, intermediate_size: 64, max_seq_len: 32}}",
          "{component_key: model, variant_key: deepseek_v3, config: {vocab_size: 64, n_layer: 2, n_head: 4, "
          "n_embd: 32, max_seq_len: 32, q_lora_rank: 16, kv_lora_rank: 16, qk_nope_head_dim: 8, "
          "qk_rope_head_dim: 4, v_head_dim: 8, intermediate_size: 64, expert_intermediate_size: 16, "
          "num_experts: 4, top_k: 2, shared_experts: 1, first_dense_blocks: 1}}"};
}

std::vector<GenerationRequest> greedy_requests() {
  core::seed_everything(3, "cpu");
  std::vector<GenerationRequest> requests;
  for (const std::int64_t length : {5, 9, 3}) {
    GenerationRequest r;
    const at::Tensor ids = at::randint(1, 64, {length}, at::kLong);
    r.prompt_ids.assign(ids.data_ptr<std::int64_t>(), ids.data_ptr<std::int64_t>() + length);
    r.sampling.temperature = 0;
    r.max_new_tokens = 8;
    requests.push_back(r);
  }
  return requests;
}

// Greedy by full forwards of the growing sequence, no cache.
GenerationResult uncached_greedy(Model& model, const GenerationRequest& r) {
  c10::NoGradGuard no_grad;
  model.eval();
  GenerationResult out;
  std::vector<std::int64_t> ids = r.prompt_ids;
  for (std::int64_t s = 0; s < r.max_new_tokens; ++s) {
    const at::Tensor last = model.forward(at::tensor(ids, at::kLong).unsqueeze(0))[0][-1].to(at::kFloat);
    const std::int64_t token = last.argmax().item<std::int64_t>();
    out.completion_ids.push_back(token);
    out.logprobs.push_back(at::log_softmax(last, -1)[token].item<double>());
    ids.push_back(token);
  }
  return out;
}

TEST(Generate, GreedyBatchesOfRaggedPromptsEqualFullForwardsTokenForToken) {
  for (const std::string& config : models()) {
    SCOPED_TRACE(config.substr(0, 60));
    const auto model = build(config);
    const std::vector<GenerationRequest> requests = greedy_requests();
    GenerationOptions options;
    options.batch_size = 2;  // two batches: [5, 9] and [3]
    const std::vector<GenerationResult> got = generate(*model, requests, options);
    ASSERT_EQ(got.size(), requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const GenerationResult want = uncached_greedy(*model, requests[i]);
      EXPECT_EQ(got[i].completion_ids, want.completion_ids) << "request " << i;
      ASSERT_EQ(got[i].logprobs.size(), want.logprobs.size());
      for (std::size_t t = 0; t < want.logprobs.size(); ++t) EXPECT_NEAR(got[i].logprobs[t], want.logprobs[t], 1e-5);
      EXPECT_EQ(got[i].finish_reason, "length");
    }
    // The third token of request 0 as the EOS: request 0 ends at its first occurrence, keeping it.
    const std::int64_t eos = got[0].completion_ids[2];
    options.eos_token_ids = {eos};
    const std::vector<GenerationResult> stopped = generate(*model, requests, options);
    const auto end = std::find(got[0].completion_ids.begin(), got[0].completion_ids.end(), eos) + 1;
    EXPECT_EQ(stopped[0].finish_reason, "stop");
    EXPECT_EQ(stopped[0].completion_ids, std::vector<std::int64_t>(got[0].completion_ids.begin(), end));
  }
}

TEST(Generate, AFixedSeedReproducesAndRequestsAreRefusedByName) {
  const auto model = build(models()[1]);
  std::vector<GenerationRequest> requests = greedy_requests();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling = SamplingParams{0.9, 20, 0.95, 0.05, 100 + i};
  }
  const auto first = generate(*model, requests, {});
  const auto again = generate(*model, requests, {});
  for (std::size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(first[i].completion_ids, again[i].completion_ids);
  requests[1].sampling.seed = 7;
  EXPECT_NE(generate(*model, requests, {})[1].completion_ids, first[1].completion_ids) << "another seed draws others";

  std::vector<GenerationRequest> bad = greedy_requests();
  bad[1].max_new_tokens = 30;  // 9 + 30 > 32
  try {
    generate(*model, bad, {});
    FAIL() << "a request past max_seq_len ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request 1: a prompt of 9 tokens and max_new_tokens 30 pass the model's "
                                         "max_seq_len 32"),
              std::string::npos)
        << e.what();
  }
  bad = greedy_requests();
  bad[2].prompt_ids.clear();
  EXPECT_THROW(generate(*model, bad, {}), Error);
  bad = greedy_requests();
  bad[0].sampling.top_p = 0;
  EXPECT_THROW(generate(*model, bad, {}), Error);
}

// Probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04 (logits their logs).
at::Tensor six_tokens() { return at::tensor({0.4, 0.25, 0.15, 0.1, 0.06, 0.04}, at::kFloat).log(); }

std::vector<bool> kept(const at::Tensor& processed) {
  const at::Tensor finite = at::isfinite(processed);
  std::vector<bool> out;
  for (std::int64_t i = 0; i < finite.size(0); ++i) out.push_back(finite[i].item<bool>());
  return out;
}

TEST(Sampling, FiltersKeepWhatTheirDefinitionsAllowAndDrawsStayInside) {
  const at::Tensor logits = six_tokens();
  SamplingParams top_k;
  top_k.top_k = 3;
  EXPECT_EQ(kept(processed_logits(logits, top_k)), (std::vector<bool>{true, true, true, false, false, false}));
  SamplingParams top_p;
  top_p.top_p = 0.6;  // 0.4 + 0.25 reach it: the rest (0.35 in all) go
  EXPECT_EQ(kept(processed_logits(logits, top_p)), (std::vector<bool>{true, true, false, false, false, false}));
  SamplingParams min_p;
  min_p.min_p = 0.3;  // at least 0.12
  EXPECT_EQ(kept(processed_logits(logits, min_p)), (std::vector<bool>{true, true, true, false, false, false}));
  SamplingParams all;
  all.top_k = 4;
  all.top_p = 0.9;
  all.min_p = 0.3;
  for (const SamplingParams& p : {top_k, top_p, min_p, all}) {
    const std::vector<bool> allowed = kept(processed_logits(logits, p));
    for (std::uint64_t seed = 0; seed < 200; ++seed) {
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
      EXPECT_TRUE(allowed[static_cast<std::size_t>(draw_token(logits, p, g))]) << "seed " << seed;
    }
  }
}

TEST(Sampling, DrawsFollowTheTemperedDistribution) {
  const at::Tensor logits = six_tokens();
  SamplingParams p;
  p.temperature = 0.7;
  const at::Tensor expected = at::softmax(logits / 0.7, -1);
  std::vector<double> counts(6, 0);
  const int draws = 4000;
  for (int seed = 0; seed < draws; ++seed) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(seed));
    counts[static_cast<std::size_t>(draw_token(logits, p, g))] += 1;
  }
  double chi_square = 0;
  for (std::size_t i = 0; i < 6; ++i) {
    const double e = expected[static_cast<std::int64_t>(i)].item<double>() * draws;
    chi_square += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi_square, 20.52) << "chi-square with 5 degrees of freedom, p = 0.001";
  // And not the untempered distribution: temperature 0.7 sharpens it measurably at this size.
  EXPECT_GT(counts[0] / draws, 0.44);
}

}  // namespace generate_test
}  // namespace tessera
