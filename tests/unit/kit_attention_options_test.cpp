// The transformer kit's attention options that Qwen2, Qwen3 and DeepSeek-V3 need, each against
// its definition: RMSNorm on every query and key head (Qwen3's q_norm / k_norm) with an output
// bias and a sliding window, written out in plain ATen; the same split over 2 tensor-parallel Gloo
// ranks, where the per-head norms' gradients must be summed over the ranks; and YaRN's rotary
// tables against transformers' own (tools/interop/rope_reference.py in the project's .venv).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <string>
#include <vector>

#include "gloo_ranks.hpp"
#include "test_support.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/rotary.hpp"

namespace tessera {
namespace kit_attention_options_test {

constexpr std::int64_t kSeq = 7;

// Qwen3's attention: grouped heads, head_dim apart from hidden / heads, per-head q/k norms, an
// output bias (its attention_bias), and a window shorter than the sequence.
nn::AttentionSpec qwen3_like() {
  nn::AttentionSpec spec;
  spec.hidden = 16;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 6;
  spec.qkv_bias = true;
  spec.output_bias = true;
  spec.qk_norm_eps = 1e-6;
  spec.sliding_window = 3;
  return spec;
}

StateDict randomise(torch::nn::Module& layer) {
  c10::NoGradGuard no_grad;
  StateDict values;
  for (auto& item : layer.named_parameters()) {
    item.value().copy_(at::randn(item.value().sizes()) * 0.3 + (item.key().find("norm") != std::string::npos ? 1 : 0));
    values[item.key()] = item.value().detach().clone();
  }
  return values;
}

nn::AttentionInputs rotary_inputs(nn::RotaryEmbedding& rotary) {
  nn::AttentionInputs inputs;
  const auto [cos, sin] = rotary.tables(kSeq, {}, at::kFloat, at::kCPU);
  inputs.rotary = {{cos, sin}};
  return inputs;
}

// Written out: project, normalise each head over head_dim (float32 RMS, times the weight), rotate,
// attend to the window's keys only, project back with the bias.
at::Tensor reference(const StateDict& w, const at::Tensor& x, const nn::AttentionSpec& s, const at::Tensor& cos,
                     const at::Tensor& sin) {
  const std::int64_t batch = x.size(0), seq = x.size(1), group = s.heads / s.kv_heads;
  const auto heads = [&](const std::string& proj, std::int64_t n, const std::string& norm) {
    at::Tensor h = at::linear(x, w.at(proj + ".weight"), w.at(proj + ".bias")).view({batch, seq, n, s.head_dim});
    if (!norm.empty()) h = at::rms_norm(h, {s.head_dim}, w.at(norm + ".weight"), *s.qk_norm_eps);
    h = h.transpose(1, 2);
    return norm.empty() ? h : nn::RotaryEmbedding::apply(h, cos, sin);
  };
  const at::Tensor q = heads("q_proj", s.heads, "q_norm");
  const at::Tensor k = heads("k_proj", s.kv_heads, "k_norm").repeat_interleave(group, 1);
  const at::Tensor v = heads("v_proj", s.kv_heads, "").repeat_interleave(group, 1);
  std::vector<std::uint8_t> band;
  for (std::int64_t i = 0; i < seq; ++i) {
    for (std::int64_t j = 0; j < seq; ++j) band.push_back(j <= i && i - j < s.sliding_window);
  }
  const at::Tensor mask = at::tensor(band).to(at::kBool).view({seq, seq});
  const at::Tensor y = at::scaled_dot_product_attention(q, k, v, mask);
  return at::linear(y.transpose(1, 2).reshape({batch, seq, s.heads * s.head_dim}), w.at("o_proj.weight"),
                    w.at("o_proj.bias"));
}

TEST(KitAttentionOptions, HeadNormsOutputBiasAndSlidingWindowAreThePlainComputation) {
  const nn::AttentionSpec spec = qwen3_like();
  nn::GroupedQueryAttention attention(spec);
  const StateDict w = randomise(attention);
  for (const char* name : {"q_norm.weight", "k_norm.weight", "o_proj.bias"}) EXPECT_TRUE(w.count(name)) << name;
  EXPECT_EQ(w.at("q_norm.weight").sizes(), at::IntArrayRef({spec.head_dim}));
  nn::RotaryEmbedding rotary({spec.head_dim, kSeq, 10000.0, std::nullopt, std::nullopt});
  const nn::AttentionInputs inputs = rotary_inputs(rotary);
  const at::Tensor x = at::randn({2, kSeq, spec.hidden});
  c10::NoGradGuard no_grad;
  const at::Tensor got = attention.forward(x, inputs);
  const at::Tensor expected = reference(w, x, spec, inputs.rotary[0].cos, inputs.rotary[0].sin);
  EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-6)) << (got - expected).abs().max().item<double>();
  // The window matters here: without it the output differs.
  nn::AttentionSpec whole_past = spec;
  whole_past.sliding_window = 0;
  EXPECT_FALSE(at::allclose(reference(w, x, whole_past, inputs.rotary[0].cos, inputs.rotary[0].sin), expected, 1e-3, 1e-4));
}

TEST(KitAttentionOptions, CausalWindowMaskSeesItselfAndTheWindowBefore) {
  const at::Tensor mask = nn::causal_window_mask(5, 2, at::kCPU);
  const std::vector<std::vector<int>> expected = {
      {1, 0, 0, 0, 0}, {1, 1, 0, 0, 0}, {0, 1, 1, 0, 0}, {0, 0, 1, 1, 0}, {0, 0, 0, 1, 1}};
  for (std::int64_t i = 0; i < 5; ++i) {
    for (std::int64_t j = 0; j < 5; ++j) EXPECT_EQ(mask[i][j].item<bool>(), expected[i][j] == 1) << i << "," << j;
  }
}

// Split over 2 tensor-parallel ranks by the layer's plan: the same output, and every parameter's
// gradient the whole layer's part. The per-head norms and the output bias are whole on each rank;
// a rank's heads give only part of their gradient, so it is summed over the ranks.
TEST(KitAttentionOptions, HeadNormsSplitOverTensorParallelRanksWithWholeGradients) {
  const nn::AttentionSpec spec = qwen3_like();
  nn::GroupedQueryAttention whole(spec);
  const StateDict w = randomise(whole);
  TensorParallelPlan plan;
  nn::GroupedQueryAttention::plan(plan, "", spec);
  EXPECT_EQ(plan.at("q_norm.weight"), TensorShard::whole_for_heads());
  nn::RotaryEmbedding rotary({spec.head_dim, kSeq, 10000.0, std::nullopt, std::nullopt});
  const nn::AttentionInputs inputs = rotary_inputs(rotary);
  const at::Tensor x = at::randn({2, kSeq, spec.hidden});
  const at::Tensor weights = at::randn({2, kSeq, spec.hidden});  // loss = sum(y * weights)
  const at::Tensor expected = whole.forward(x, inputs);
  (expected * weights).sum().backward();
  StateDict whole_grads;
  for (const auto& item : whole.named_parameters()) whole_grads[item.key()] = item.value().grad().clone();

  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t, std::shared_ptr<Communicator> group) {
    const TensorParallel tp(group, /*sequence_parallel=*/false);
    nn::GroupedQueryAttention part(spec, tp);
    {
      c10::NoGradGuard no_grad;
      for (auto& item : part.named_parameters()) {
        item.value().copy_(tp.part_of(w.at(item.key()), shard_in(plan, item.key())));
      }
    }
    const at::Tensor got = part.forward(x, inputs);
    if (!at::allclose(got, expected.detach(), 1e-5, 1e-6)) {
      throw Error("tp 2 output differs by " + std::to_string((got - expected).abs().max().item<double>()));
    }
    (got * weights).sum().backward();
    for (const auto& item : part.named_parameters()) {
      const at::Tensor want = tp.part_of(whole_grads.at(item.key()), shard_in(plan, item.key()));
      if (!at::allclose(item.value().grad(), want, 1e-4, 1e-5)) {
        throw Error(item.key() + "'s gradient differs by " +
                    std::to_string((item.value().grad() - want).abs().max().item<double>()));
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// Rotary tables of transformers' LlamaRotaryEmbedding for a config, one JSON line.
nlohmann::json transformers_tables(const std::string& args) {
  std::string out;
  const std::string python = testing::source_dir() + "/.venv/bin/python3";
  const std::string probe = " -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"transformers\") is None)'";
  if (testing::run_command(python + probe + " 2>&1", out) != 0) return nullptr;
  if (args.empty()) return nlohmann::json::object();  // only asked whether it is there
  const int rc = testing::run_command(
      "(" + python + " " + testing::source_dir() + "/tools/interop/rope_reference.py " + args + " 2>/dev/null)", out);
  EXPECT_EQ(rc, 0) << out;
  return nlohmann::json::parse(out, nullptr, false);
}

void expect_tables(const nlohmann::json& reference, nn::RotaryEmbedding& rotary, std::int64_t positions) {
  ASSERT_TRUE(reference.is_object());
  const auto [cos, sin] = rotary.tables(positions, {}, at::kFloat, at::kCPU);
  const auto as_tensor = [](const nlohmann::json& rows) {
    std::vector<float> flat;
    for (const auto& row : rows) {
      for (const auto& v : row) flat.push_back(v.get<float>());
    }
    return at::tensor(flat).view({static_cast<std::int64_t>(rows.size()), -1});
  };
  const at::Tensor want_cos = as_tensor(reference.at("cos")), want_sin = as_tensor(reference.at("sin"));
  EXPECT_TRUE(at::allclose(cos, want_cos, 1e-6, 1e-6)) << (cos - want_cos).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(sin, want_sin, 1e-6, 1e-6)) << (sin - want_sin).abs().max().item<double>();
}

TEST(KitAttentionOptions, YarnTablesAreTransformers) {
  if (transformers_tables("").is_null()) {
    GTEST_SKIP() << "transformers is not installed in .venv (tools/setup.sh installs it)";
  }
  constexpr std::int64_t kHeadDim = 16, kPositions = 64;
  // Qwen's long-context YaRN: factor 4 over 16 original positions, the default betas and factor.
  nn::YarnScaling qwen;
  qwen.factor = 4.0;
  qwen.original_max_positions = 16;
  nn::RotaryEmbedding plain_yarn({kHeadDim, kPositions, 10000.0, std::nullopt, qwen});
  expect_tables(transformers_tables("--head-dim 16 --positions 64 --yarn 4 16"), plain_yarn, kPositions);
  // DeepSeek-V3's: its betas, mscale over mscale_all_dim as the cos/sin factor, another theta.
  nn::YarnScaling deepseek = qwen;
  deepseek.beta_fast = 16;
  deepseek.beta_slow = 2;
  deepseek.mscale = 1.0;
  deepseek.mscale_all_dim = 0.707;
  nn::RotaryEmbedding deepseek_yarn({kHeadDim, kPositions, 500.0, std::nullopt, deepseek});
  expect_tables(transformers_tables("--head-dim 16 --positions 64 --theta 500 --yarn 4 16 --beta-fast 16 "
                                    "--beta-slow 2 --mscale 1 --mscale-all-dim 0.707"),
                deepseek_yarn, kPositions);
  // Not a no-op: YaRN's tables are not the plain ones.
  nn::RotaryEmbedding plain({kHeadDim, kPositions, 10000.0, std::nullopt, std::nullopt});
  const auto yarn_cos = plain_yarn.tables(kPositions, {}, at::kFloat, at::kCPU).first;
  EXPECT_FALSE(at::allclose(yarn_cos, plain.tables(kPositions, {}, at::kFloat, at::kCPU).first, 1e-3, 1e-3));
  EXPECT_NEAR(deepseek.cos_sin_factor(), (0.1 * std::log(4.0) + 1) / (0.1 * 0.707 * std::log(4.0) + 1), 1e-12);
}

}  // namespace kit_attention_options_test
}  // namespace tessera
