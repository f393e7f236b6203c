// The kit's multi-head latent attention against transformers' DeepseekV3Attention itself
// (tools/interop/mla_reference.py in the project's .venv writes a layer's weights, input, rotary
// tables and output): with a query latent (q_lora_rank) and YaRN's softmax scale, and with one
// q_proj at the plain scale. Then the layer split over 2 tensor-parallel Gloo ranks by its plan:
// the same output, and every gradient the whole layer's part (the down projections and their
// norms, whole on each rank, summed over the ranks' heads).
#include <gtest/gtest.h>

#include <ATen/ops/randn.h>
#include <c10/core/GradMode.h>

#include <string>

#include "gloo_ranks.hpp"
#include "test_support.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/safetensors.hpp"
#include "tessera/nn/latent_attention.hpp"

namespace tessera {
namespace kit_latent_attention_test {

// The reference's layer: hidden 32, 4 heads, kv_lora_rank 16, qk_nope 8, qk_rope 4, v 6, biases.
nn::LatentAttentionSpec reference_spec(std::int64_t q_lora_rank, double scale) {
  nn::LatentAttentionSpec spec;
  spec.hidden = 32;
  spec.heads = 4;
  spec.q_lora_rank = q_lora_rank;
  spec.kv_lora_rank = 16;
  spec.qk_nope_head_dim = 8;
  spec.qk_rope_head_dim = 4;
  spec.v_head_dim = 6;
  spec.bias = true;
  spec.softmax_scale = scale;
  return spec;
}

bool have_transformers() {
  std::string out;
  return testing::run_command(testing::source_dir() +
                                  "/.venv/bin/python3 -c 'import importlib.util, sys; "
                                  "sys.exit(importlib.util.find_spec(\"transformers\") is None)' 2>&1",
                              out) == 0;
}

// The reference's tensors for `args`.
StateDict transformers_layer(const testing::TempDir& dir, const std::string& args) {
  const std::string file = dir.file("mla.safetensors");
  std::string out;
  const int rc = testing::run_command(testing::source_dir() + "/.venv/bin/python3 " + testing::source_dir() +
                                          "/tools/interop/mla_reference.py " + file + " " + args + " 2>&1",
                                      out);
  EXPECT_EQ(rc, 0) << out;
  return rc == 0 ? read_safetensors(file).tensors : StateDict{};
}

void load(nn::MultiHeadLatentAttention& layer, const StateDict& ref) {
  c10::NoGradGuard no_grad;
  for (auto& item : layer.named_parameters()) {
    const auto it = ref.find("w." + item.key());
    ASSERT_NE(it, ref.end()) << item.key() << " is not transformers'";
    item.value().copy_(it->second);
  }
  std::size_t weights = 0;
  for (const auto& [name, tensor] : ref) weights += name.rfind("w.", 0) == 0;
  EXPECT_EQ(weights, layer.named_parameters().size()) << "transformers' layer has parameters this one lacks";
}

TEST(KitLatentAttention, IsTransformersDeepseekV3Attention) {
  if (!have_transformers()) GTEST_SKIP() << "transformers is not installed in .venv (tools/setup.sh installs it)";
  testing::TempDir dir;
  for (const auto& [q_lora_rank, args] :
       {std::pair<std::int64_t, std::string>{12, "--q-lora-rank 12 --yarn"}, {0, "--seed 1"}}) {
    SCOPED_TRACE(args);
    const StateDict ref = transformers_layer(dir, args);
    ASSERT_FALSE(ref.empty());
    nn::MultiHeadLatentAttention layer(reference_spec(q_lora_rank, ref.at("scale").item<double>()));
    load(layer, ref);
    nn::AttentionInputs inputs;
    inputs.rotary = {{ref.at("cos"), ref.at("sin")}};
    c10::NoGradGuard no_grad;
    layer.eval();
    const at::Tensor got = layer.forward(ref.at("x"), inputs);
    EXPECT_TRUE(at::allclose(got, ref.at("y"), 1e-5, 1e-5)) << (got - ref.at("y")).abs().max().item<double>();
  }
}

TEST(KitLatentAttention, SplitsOverTensorParallelRanksWithWholeGradients) {
  const nn::LatentAttentionSpec spec = reference_spec(12, 0.0);
  nn::MultiHeadLatentAttention whole(spec);
  StateDict w;
  {
    c10::NoGradGuard no_grad;
    for (auto& item : whole.named_parameters()) {
      item.value().copy_(at::randn(item.value().sizes()) * 0.3 + (item.key().find("layernorm") != std::string::npos));
      w[item.key()] = item.value().detach().clone();
    }
  }
  TensorParallelPlan plan;
  nn::MultiHeadLatentAttention::plan(plan, "", spec);
  EXPECT_EQ(plan.at("kv_a_proj_with_mqa.weight"), TensorShard::whole_for_heads());
  EXPECT_TRUE(plan.at("q_a_layernorm.weight").replicated());
  constexpr std::int64_t kSeq = 6;
  nn::AttentionInputs inputs;
  inputs.rotary = {{at::randn({kSeq, spec.qk_rope_head_dim}), at::randn({kSeq, spec.qk_rope_head_dim})}};
  const at::Tensor x = at::randn({2, kSeq, spec.hidden});
  const at::Tensor weights = at::randn({2, kSeq, spec.hidden});
  const at::Tensor expected = whole.forward(x, inputs);
  (expected * weights).sum().backward();
  StateDict grads;
  for (const auto& item : whole.named_parameters()) grads[item.key()] = item.value().grad().clone();

  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t, std::shared_ptr<Communicator> group) {
    const TensorParallel tp(group, /*sequence_parallel=*/false);
    nn::MultiHeadLatentAttention part(spec, tp);
    {
      c10::NoGradGuard no_grad;
      for (auto& item : part.named_parameters()) {
        item.value().copy_(tp.part_of(w.at(item.key()), shard_in(plan, item.key())));
      }
    }
    const at::Tensor got = part.forward(x, inputs);
    if (!at::allclose(got, expected.detach(), 1e-5, 1e-5)) {
      throw Error("tp 2 output differs by " + std::to_string((got - expected).abs().max().item<double>()));
    }
    (got * weights).sum().backward();
    for (const auto& item : part.named_parameters()) {
      const at::Tensor want = tp.part_of(grads.at(item.key()), shard_in(plan, item.key()));
      if (!at::allclose(item.value().grad(), want, 1e-4, 1e-5)) {
        throw Error(item.key() + "'s gradient differs by " +
                    std::to_string((item.value().grad() - want).abs().max().item<double>()));
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

}  // namespace kit_latent_attention_test
}  // namespace tessera
