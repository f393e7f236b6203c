// The SDK's transformer kit (tessera/nn/) where no bundled model shows it yet: grouped-query
// attention with q/k/v biases against plain ATen, whole and split over 2 tensor-parallel Gloo
// ranks by its own plan; and the Hugging Face weight-name tables (names, transposes, experts one
// tensor each, PEFT module names) against what GPT-2's and Mixtral's files spell.
#include <gtest/gtest.h>

#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>

#include <string>

#include "gloo_ranks.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/weight_names.hpp"

namespace tessera {
namespace transformer_kit_test {

nn::AttentionSpec biased_gqa() {
  nn::AttentionSpec spec;
  spec.hidden = 16;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 6;  // independent of hidden / heads, as Qwen3's
  spec.qkv_bias = true;
  return spec;
}

// Random values in every parameter of `layer` (biases too: zeros would hide a missing bias).
StateDict randomise(torch::nn::Module& layer) {
  c10::NoGradGuard no_grad;
  StateDict values;
  for (auto& item : layer.named_parameters()) {
    item.value().copy_(at::randn(item.value().sizes()) * 0.3);
    values[item.key()] = item.value().detach().clone();
  }
  return values;
}

// Causal grouped-query attention written out: q/k/v projections with their biases, each key/value
// head serving heads / kv_heads query heads, the output projection without bias.
at::Tensor reference(const StateDict& w, const at::Tensor& x, const nn::AttentionSpec& s) {
  const std::int64_t batch = x.size(0), seq = x.size(1), group = s.heads / s.kv_heads;
  const auto heads = [&](const std::string& proj, std::int64_t n) {
    return at::linear(x, w.at(proj + ".weight"), w.at(proj + ".bias")).view({batch, seq, n, s.head_dim}).transpose(1, 2);
  };
  const at::Tensor q = heads("q_proj", s.heads);
  const at::Tensor k = heads("k_proj", s.kv_heads).repeat_interleave(group, 1);
  const at::Tensor v = heads("v_proj", s.kv_heads).repeat_interleave(group, 1);
  const at::Tensor y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  return at::linear(y.transpose(1, 2).reshape({batch, seq, s.heads * s.head_dim}), w.at("o_proj.weight"));
}

TEST(TransformerKit, GroupedQueryAttentionWithBiasesIsThePlainComputation) {
  const nn::AttentionSpec spec = biased_gqa();
  nn::GroupedQueryAttention attention(spec);
  const StateDict w = randomise(attention);
  ASSERT_TRUE(w.count("q_proj.bias") && w.count("k_proj.bias") && w.count("v_proj.bias"));
  EXPECT_FALSE(w.count("o_proj.bias"));
  const at::Tensor x = at::randn({2, 5, spec.hidden});
  c10::NoGradGuard no_grad;
  const at::Tensor got = attention.forward(x, {});
  const at::Tensor expected = reference(w, x, spec);
  EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-6)) << (got - expected).abs().max().item<double>();
}

// Each tensor-parallel rank holds its heads (and their biases) as the layer's plan cuts them;
// the ranks' outputs summed are the whole layer's.
TEST(TransformerKit, GroupedQueryAttentionWithBiasesSplitsOverTensorParallelRanksByItsPlan) {
  const nn::AttentionSpec spec = biased_gqa();
  nn::GroupedQueryAttention whole(spec);
  const StateDict w = randomise(whole);
  TensorParallelPlan plan;
  nn::GroupedQueryAttention::plan(plan, "", spec);
  EXPECT_EQ(plan.at("q_proj.bias"), (TensorShard{0, 1}));
  const at::Tensor x = at::randn({2, 5, spec.hidden});
  at::Tensor expected;
  {
    c10::NoGradGuard no_grad;
    expected = whole.forward(x, {});
  }
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t, std::shared_ptr<Communicator> group) {
    const TensorParallel tp(group, /*sequence_parallel=*/false);
    nn::GroupedQueryAttention part(spec, tp);
    c10::NoGradGuard no_grad;
    for (auto& item : part.named_parameters()) {
      item.value().copy_(tp.part_of(w.at(item.key()), shard_in(plan, item.key())));
    }
    const at::Tensor got = part.forward(x, {});
    if (!at::allclose(got, expected, 1e-5, 1e-6)) {
      throw Error("tp 2 differs by " + std::to_string((got - expected).abs().max().item<double>()));
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TransformerKit, WeightNameTablesSpellHuggingFacesNames) {
  const nn::HfWeightNames gpt2{{{"", "transformer."}}, {".c_attn.weight", ".c_proj.weight", ".c_fc.weight"}, ""};
  EXPECT_EQ(gpt2.hf_name("h.0.attn.c_attn.weight"), "transformer.h.0.attn.c_attn.weight");
  EXPECT_TRUE(gpt2.is_transposed("h.0.mlp.c_proj.weight"));
  EXPECT_FALSE(gpt2.is_transposed("h.0.mlp.c_proj.bias"));
  EXPECT_FALSE(gpt2.is_transposed("wte.weight"));
  EXPECT_EQ(gpt2.module("h.1.attn.c_attn").name, "transformer.h.1.attn.c_attn");
  EXPECT_TRUE(gpt2.module("h.1.attn.c_attn").fan_in_fan_out);
  const at::Tensor conv = at::randn({4, 12});
  const StateDict exported = gpt2.export_tensors({{"h.0.attn.c_attn.weight", conv}, {"wte.weight", conv}});
  EXPECT_TRUE(exported.at("transformer.h.0.attn.c_attn.weight").equal(conv.t()));
  EXPECT_TRUE(exported.at("transformer.wte.weight").equal(conv));

  const nn::HfWeightNames mixtral{{{"lm_head", ""}, {"", "model."}}, {}, ".experts."};
  EXPECT_EQ(mixtral.hf_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(mixtral.hf_name("lm_headless.weight"), "model.lm_headless.weight");  // a module, not a prefix
  EXPECT_EQ(mixtral.module("layers.0.self_attn.q_proj").name, "model.layers.0.self_attn.q_proj");
  EXPECT_FALSE(mixtral.module("layers.0.self_attn.q_proj").fan_in_fan_out);
  const std::string stack = "layers.3.block_sparse_moe.experts.w1.weight";
  EXPECT_TRUE(mixtral.is_expert_stack(stack));
  EXPECT_EQ(mixtral.hf_expert_name(stack, 7), "model.layers.3.block_sparse_moe.experts.7.w1.weight");
  const at::Tensor experts = at::randn({3, 5, 2});
  const StateDict unstacked = mixtral.export_tensors({{stack, experts}});
  ASSERT_EQ(unstacked.size(), 3u);
  for (std::int64_t e = 0; e < 3; ++e) {
    EXPECT_TRUE(unstacked.at("model.layers.3.block_sparse_moe.experts." + std::to_string(e) + ".w1.weight").equal(experts[e]));
  }
}

// Import reads each parameter under its Hugging Face name (transposed back, experts stacked) and
// names whatever is missing or left over.
TEST(TransformerKit, ImportByTheTableTakesEveryTensorAndNamesTheRest) {
  // h.0.attn.c_attn.weight [6, 4] and h.0.moe.experts.w1.weight [2 experts, 3, 4].
  torch::nn::Module model;
  auto block = model.register_module("h", std::make_shared<torch::nn::Module>())
                   ->register_module("0", std::make_shared<torch::nn::Module>());
  auto proj = block->register_module("attn", std::make_shared<torch::nn::Module>())
                  ->register_module("c_attn", std::make_shared<Linear>(4, 6, false));
  auto stack = block->register_module("moe", std::make_shared<torch::nn::Module>())
                   ->register_module("experts", std::make_shared<torch::nn::Module>())
                   ->register_module("w1", std::make_shared<nn::ExpertLinear>(2, 4, 3, false));
  const nn::HfWeightNames names{{{"", "m."}}, {".c_attn.weight"}, ".experts."};
  HfCheckpoint hf;
  hf.folder = "/ckpt";
  const at::Tensor stored = at::randn({4, 6}), e0 = at::randn({3, 4}), e1 = at::randn({3, 4});
  hf.tensors = {{"m.h.0.attn.c_attn.weight", stored},
                {"m.h.0.moe.experts.0.w1.weight", e0},
                {"m.h.0.moe.experts.1.w1.weight", e1}};
  nn::import_hf_weights(hf, model, names, {}, {}, {}, 2, /*partial=*/false);
  EXPECT_TRUE(proj->weight.equal(stored.t()));
  EXPECT_TRUE(stack->weight.equal(at::stack({e0, e1})));

  hf.tensors["m.unknown.weight"] = at::zeros({1});
  try {
    nn::import_hf_weights(hf, model, names, {}, {}, {}, 2, false);
    ADD_FAILURE() << "an unused tensor must be an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/ckpt has 1 tensor this model does not have: m.unknown.weight"),
              std::string::npos)
        << e.what();
  }
  // One pipeline stage takes its own tensors only.
  EXPECT_NO_THROW(nn::import_hf_weights(hf, model, names, {}, {}, {}, 2, /*partial=*/true));
}

}  // namespace transformer_kit_test
}  // namespace tessera
