// Model::decode with a KvCache (tessera/components/kv_cache.hpp) for every kit family: three
// prompts of different lengths left-padded into one prefill, then six decode steps of one token a
// row, give at every real position the logits of a full forward of that sequence alone (1e-5):
// gpt (fused q|k|v, learned positions), llama (grouped keys), qwen2 and gemma3_text with sliding
// windows shorter than the text, qwen3 (per-head norms), qwen3_moe and deepseek_v3 (latent
// attention, whose cache holds the latent and rotary key). Under tensor parallelism on 2 Gloo
// ranks (each rank its heads' keys and values) the logits equal one rank's.
#include <gtest/gtest.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <mutex>
#include <string>
#include <vector>

#include "gloo_ranks.hpp"
#include "test_support.hpp"
#include "tessera/components/kv_cache.hpp"
#include "tessera/components/model.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/error.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/run/precision.hpp"

namespace tessera {
namespace kv_cache_test {

struct Family {
  const char* name;
  std::string config;  // the model's YAML, vocabulary 64 and positions 32
};

std::vector<Family> families() {
  return {
      {"gpt", "{component_key: model, variant_key: gpt, config: {vocab_size: 64, n_layer: 2, n_head: 4, n_embd: 32, "
              "max_seq_len: 32}}"},
      {"llama", "{component_key: model, variant_key: llama, config: {vocab_size: 64, n_layer: 2, n_head: 4, "
                "n_kv_head: 2, n_embd: 32, intermediate_size: 64, max_seq_len: 32}}"},
      {"qwen2_sliding", "{component_key: model, variant_key: qwen2, config: {vocab_size: 64, n_layer: 2, n_head: 4, "
                        "n_kv_head: 2, n_embd: 32, intermediate_size: 64, max_seq_len: 32, sliding_window: 4, "
                        "max_window_layers: 1}}"},
      {"qwen3", "{component_key: model, variant_key: qwen3, config: {vocab_size: 64, n_layer: 2, n_head: 4, "
                "n_kv_head: 2, n_embd: 32, head_dim: 16, intermediate_size: 64, max_seq_len: 32}}"},
      {"qwen3_moe", "{component_key: model, variant_key: qwen3_moe, config: {vocab_size: 64, n_layer: 2, n_head: 4, "
                    "n_kv_head: 2, n_embd: 32, head_dim: 16, intermediate_size: 64, max_seq_len: 32, num_experts: 4, "
                    "top_k: 2, expert_intermediate_size: 16, dense_blocks: [0]}}"},
      {"deepseek_v3", "{component_key: model, variant_key: deepseek_v3, config: {vocab_size: 64, n_layer: 2, "
                      "n_head: 4, n_embd: 32, max_seq_len: 32, q_lora_rank: 16, kv_lora_rank: 16, "
                      "qk_nope_head_dim: 8, qk_rope_head_dim: 4, v_head_dim: 8, intermediate_size: 64, "
                      "expert_intermediate_size: 16, num_experts: 4, top_k: 2, shared_experts: 1, "
                      "first_dense_blocks: 1}}"},
      {"gemma3_sliding", "{component_key: model, variant_key: gemma3_text, config: {vocab_size: 64, n_layer: 2, "
                         "n_head: 4, n_kv_head: 2, n_embd: 32, head_dim: 16, intermediate_size: 64, max_seq_len: 32, "
                         "sliding_window: 4, sliding_window_pattern: 2}}"},
  };
}

std::mutex build_mutex;  // models built in turn, each from the same global seed

std::shared_ptr<Model> build(const Family& f, const RunContext& context = {}) {
  std::lock_guard<std::mutex> lock(build_mutex);
  core::seed_everything(7, "cpu");
  auto model = testing::built<Model>(testing::build_components("model: " + f.config + "\n", context), "model");
  model->eval();
  return model;
}

// Three prompts of 5, 9 and 3 tokens and six further tokens each, drawn from a fixed seed.
struct Texts {
  std::vector<at::Tensor> prompts, continuations;
};

Texts texts() {
  Texts t;
  core::seed_everything(3, "cpu");
  for (const std::int64_t length : {5, 9, 3}) {
    t.prompts.push_back(at::randint(1, 64, {length}, at::kLong));
    t.continuations.push_back(at::randint(1, 64, {6}, at::kLong));
  }
  return t;
}

// The prefill's logits at each real slot and every decode step's, per row, in position order:
// [length + 6, vocab] per prompt.
std::vector<at::Tensor> cached_logits(Model& model, const Texts& t, std::int64_t* cache_bytes = nullptr) {
  c10::NoGradGuard no_grad;
  const std::int64_t rows = static_cast<std::int64_t>(t.prompts.size()), longest = 9, steps = 6;
  std::vector<at::Tensor> ids, positions;
  for (const at::Tensor& p : t.prompts) {
    const std::int64_t pad = longest - p.size(0);
    ids.push_back(at::cat({at::full({pad}, 0, at::kLong), p}));
    positions.push_back(at::cat({at::full({pad}, -1, at::kLong), at::arange(p.size(0), at::kLong)}));
  }
  // Room for a pass padded to a multiple of the tensor-parallel ranks (sequence parallelism).
  KvCache cache(rows, 2 * (longest + steps), model.transformer_shape().blocks, c10::Device(c10::kCPU));
  const at::Tensor prefill = model.decode(at::stack(ids), at::stack(positions), cache);
  const at::Tensor last = model.decode(at::stack(ids).narrow(1, 0, 1), at::full({rows, 1}, -1, at::kLong), cache);
  (void)last;  // a pass of padding alone: it adds slots no query sees
  std::vector<std::vector<at::Tensor>> per_row(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t length = t.prompts[static_cast<std::size_t>(r)].size(0);
    per_row[static_cast<std::size_t>(r)].push_back(prefill[r].narrow(0, longest - length, length));
  }
  for (std::int64_t s = 0; s < steps; ++s) {
    std::vector<at::Tensor> step_ids, step_positions;
    for (std::int64_t r = 0; r < rows; ++r) {
      step_ids.push_back(t.continuations[static_cast<std::size_t>(r)].narrow(0, s, 1));
      step_positions.push_back(at::full({1}, t.prompts[static_cast<std::size_t>(r)].size(0) + s, at::kLong));
    }
    const at::Tensor logits = model.decode(at::stack(step_ids), at::stack(step_positions), cache, /*last_only=*/true);
    for (std::int64_t r = 0; r < rows; ++r) per_row[static_cast<std::size_t>(r)].push_back(logits[r]);
  }
  if (cache_bytes) *cache_bytes = cache.bytes();
  std::vector<at::Tensor> out;
  for (auto& pieces : per_row) out.push_back(at::cat(pieces));
  return out;
}

// A full forward of each sequence alone, prompt and continuation: the logits of every position.
std::vector<at::Tensor> full_logits(Model& model, const Texts& t) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (std::size_t r = 0; r < t.prompts.size(); ++r) {
    const at::Tensor ids = at::cat({t.prompts[r], t.continuations[r]}).unsqueeze(0);
    out.push_back(model.forward(ids)[0].narrow(0, 0, t.prompts[r].size(0) + 6));
  }
  return out;
}

class KitDecode : public ::testing::TestWithParam<Family> {};

TEST_P(KitDecode, CachedPassesOfRaggedPromptsEqualAFullForward) {
  const auto model = build(GetParam());
  ASSERT_TRUE(model->decodes());
  const Texts t = texts();
  std::int64_t bytes = 0;
  const std::vector<at::Tensor> cached = cached_logits(*model, t, &bytes);
  const std::vector<at::Tensor> full = full_logits(*model, t);
  for (std::size_t r = 0; r < full.size(); ++r) {
    ASSERT_EQ(cached[r].sizes(), full[r].sizes()) << "row " << r;
    EXPECT_TRUE(at::allclose(cached[r], full[r], 1e-5, 1e-5))
        << "row " << r << ": largest difference " << (cached[r] - full[r]).abs().max().item<double>();
  }
  EXPECT_GT(bytes, 0);
}

// Under bf16 autocast, as the trainer's rollouts and `tessera generate --precision bf16` decode: the
// cache's attention runs in float32 on the CPU (its keys and values kept so, the same bytes as a
// float32 model's) and the logits follow the bf16 full forward within bf16's rounding.
TEST_P(KitDecode, Bfloat16CachedPassesFollowTheBfloat16FullForward) {
  if (!cpu_has_fast_bf16_matmul()) GTEST_SKIP() << "no fast bf16 matrix products on this CPU";
  const auto model = build(GetParam());
  const Texts t = texts();
  std::int64_t float32_bytes = 0, bf16_bytes = 0;
  cached_logits(*model, t, &float32_bytes);
  AutocastGuard autocast(c10::Device(c10::kCPU), at::kBFloat16);
  const std::vector<at::Tensor> cached = cached_logits(*model, t, &bf16_bytes);
  const std::vector<at::Tensor> full = full_logits(*model, t);
  for (std::size_t r = 0; r < full.size(); ++r) {
    const double difference = (cached[r].to(at::kFloat) - full[r].to(at::kFloat)).abs().max().item<double>();
    const double scale = full[r].to(at::kFloat).abs().max().item<double>();
    EXPECT_LT(difference, 0.05 * scale) << "row " << r;
  }
  // DeepSeek's latent attention caches the latent, not the heads' keys and values, in the model's dtype.
  if (std::string(GetParam().name) != "deepseek_v3") EXPECT_EQ(bf16_bytes, float32_bytes);
}

INSTANTIATE_TEST_SUITE_P(KvCache, KitDecode, ::testing::ValuesIn(families()),
                         [](const ::testing::TestParamInfo<Family>& info) { return std::string(info.param.name); });

TEST(KvCache, TwoTensorParallelRanksDecodeAsOneRank) {
  const Texts t = texts();
  for (const Family& f : {families()[0], families()[2]}) {
    SCOPED_TRACE(f.name);
    const std::vector<at::Tensor> one = cached_logits(*build(f), t);
    std::mutex mutex;
    std::vector<std::string> mismatches;
    const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> world) {
      RunContext context = testing::rank_context(world, 7);
      ParallelDims dims;
      dims.tp = 2;
      context.mesh = core::make_device_mesh(world, dims);
      context.parallel = dims;
      const std::vector<at::Tensor> split = cached_logits(*build(f, context), t);
      std::lock_guard<std::mutex> lock(mutex);
      for (std::size_t r = 0; r < one.size(); ++r) {
        if (!at::allclose(split[r], one[r], 1e-5, 1e-5)) {
          mismatches.push_back("rank " + std::to_string(rank) + " row " + std::to_string(r));
        }
      }
    });
    for (const auto& e : errors) EXPECT_EQ(e, "");
    EXPECT_TRUE(mismatches.empty()) << mismatches.front();
  }
}

// What a layer derives from its weights is made once per cache and layer, and kept.
TEST(KvCache, ADerivedTensorIsMadeOncePerLayerAndName) {
  KvCache cache(2, 8, 2, c10::Device(c10::kCPU));
  int made = 0;
  const auto make = [&made] {
    ++made;
    return at::full({3}, static_cast<double>(made), at::kFloat);
  };
  const at::Tensor first = cache.derived(0, "qkv_proj.weight", make);
  EXPECT_TRUE(cache.derived(0, "qkv_proj.weight", make).is_same(first));
  EXPECT_EQ(made, 1);
  EXPECT_FALSE(cache.derived(1, "qkv_proj.weight", make).is_same(first)) << "another layer";
  EXPECT_FALSE(cache.derived(0, "gate_up_proj.weight", make).is_same(first)) << "another name";
  EXPECT_EQ(made, 3);
  EXPECT_THROW(cache.derived(2, "qkv_proj.weight", make), Error);
  EXPECT_EQ(cache.bytes(), 0) << "derived tensors are not the cache's keys and values";
}

TEST(KvCache, APassPastCapacityOrOfAnotherBatchIsRefusedAndLeavesTheCacheAsItWas) {
  KvCache cache(2, 4, 1, c10::Device(c10::kCPU));
  EXPECT_THROW(cache.begin_pass(at::zeros({3, 1}, at::kLong)), Error) << "another batch";
  EXPECT_THROW(cache.begin_pass(at::zeros({2, 5}, at::kLong)), Error) << "past capacity";
  cache.begin_pass(at::tensor({0, 1, -1, 0}, at::kLong).view({2, 2}));
  cache.abandon_pass();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_TRUE(cache.key_positions().lt(0).all().item<bool>()) << "the abandoned slots hold no key";
  // A window of 2: the query at position 3 sees positions 2 and 3 only.
  cache.begin_pass(at::tensor({0, 1, 2, 3, -1, -1, 0, 1}, at::kLong).view({2, 4}));
  const at::Tensor seen = cache.visible(2);
  EXPECT_TRUE(at::equal(seen[0][0][3], at::tensor({0, 0, 1, 1}, at::kInt).to(at::kBool)));
  EXPECT_TRUE(seen[1][0][0].all().item<bool>()) << "a padding query sees every key, never none";
  EXPECT_TRUE(at::equal(seen[1][0][3], at::tensor({0, 0, 1, 1}, at::kInt).to(at::kBool)));
  cache.end_pass();
  EXPECT_EQ(cache.length(), 4);
}

}  // namespace kv_cache_test
}  // namespace tessera
