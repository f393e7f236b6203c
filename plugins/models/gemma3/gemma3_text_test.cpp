// model/gemma3_text built through the real loader and factory at small sizes: what the kit
// derives from its family spec (Hugging Face's parameter names with the four norms per block, the
// transformer shape, FLOPs from the whole parameter count), its init (norms at zero, scaling by
// 1 + weight), deferred init equal to the model built whole, the sliding layers' window, the
// export's config.json and record, the final softcap, and config errors.
// (Agreement with transformers itself is tests/integration/gemma3_interop_test.cpp.)
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "tessera/components/model.hpp"
#include "tessera/error.hpp"
#include "deferred_init_check.hpp"
#include "test_support.hpp"

namespace tessera {
namespace gemma3_text_test {

constexpr std::int64_t kVocab = 32, kLayers = 4, kEmbd = 16, kHeadDim = 8, kHeads = 4;

// Four blocks, every second one global, windows of 3; `extra` YAML fields after these.
std::string gemma_yaml(const std::string& extra = "") {
  const std::string fields = "vocab_size: 32, n_layer: 4, n_head: 4, n_kv_head: 2, n_embd: 16, head_dim: 8, "
                             "intermediate_size: 24, max_seq_len: 16, sliding_window: 3, sliding_window_pattern: 2";
  return "model: {component_key: model, variant_key: gemma3_text, config: {" + fields + (extra.empty() ? "" : ", ") +
         extra + "}}\n";
}

std::shared_ptr<Model> make_gemma(const std::string& extra = "") {
  core::seed_everything(1234, "cpu");
  return testing::built<Model>(testing::build_components(gemma_yaml(extra)), "model");
}

TEST(Gemma3Model, TheKitDerivesNamesShapeAndFlopsFromTheSpec) {
  auto model = make_gemma();
  const auto params = model->named_parameters();
  for (const char* name : {"embed_tokens.weight", "layers.0.input_layernorm.weight", "layers.0.self_attn.q_norm.weight",
                           "layers.0.post_attention_layernorm.weight", "layers.0.pre_feedforward_layernorm.weight",
                           "layers.0.post_feedforward_layernorm.weight", "layers.3.mlp.gate_proj.weight", "norm.weight"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  EXPECT_FALSE(params.contains("lm_head.weight")) << "the head is tied";
  EXPECT_EQ(params["layers.1.self_attn.q_proj.weight"].sizes(), at::IntArrayRef({kHeads * kHeadDim, kEmbd}));
  const TransformerShape shape = model->transformer_shape();
  EXPECT_EQ(shape.blocks, kLayers);
  EXPECT_EQ(shape.head_dim, kHeadDim);
  EXPECT_EQ(shape.kv_heads, 2);
  EXPECT_EQ(shape.mlp_hidden, 24);
  EXPECT_TRUE(shape.moe_blocks.empty());
  // Tied: every parameter counts (the embedding is the head's matmul).
  EXPECT_DOUBLE_EQ(model->flops_per_token(8),
                   6.0 * static_cast<double>(model->num_parameters()) + 12.0 * kLayers * kHeads * kHeadDim * 8);
}

TEST(Gemma3Model, NormsStartAtZeroAndProjectionsAreUnscaled) {
  auto model = make_gemma();
  for (const auto& item : model->named_parameters()) {
    if (item.key().find("norm") != std::string::npos) {
      EXPECT_TRUE(item.value().eq(0).all().item<bool>()) << item.key() << ": (1 + weight) starts at the identity";
    }
  }
  const double o_std = model->named_parameters()["layers.0.self_attn.o_proj.weight"].std().item<double>();
  EXPECT_NEAR(o_std, 0.02, 0.006) << "Gemma's init does not scale the residual outputs";
}

TEST(Gemma3Model, DeferredInitGivesTheWeightsOfTheModelBuiltWhole) {
  testing::expect_deferred_init_gives_whole_weights(gemma_yaml(), 11);
}

TEST(Gemma3Model, SlidingLayersSeeTheirWindowOnly) {
  auto model = make_gemma("layer_types: [sliding_attention, sliding_attention, sliding_attention, sliding_attention]");
  model->eval();
  c10::NoGradGuard no_grad;
  at::Tensor ids = at::randint(kVocab, {1, 12}, at::kLong);
  const at::Tensor before = model->forward(ids);
  ids.index_put_({0, 0}, (ids.index({0, 0}).item<std::int64_t>() + 1) % kVocab);
  const at::Tensor after = model->forward(ids);
  // Four blocks of window 3 reach 4 · 2 = 8 positions back: position 9 on never sees token 0.
  EXPECT_FALSE(at::allclose(before.narrow(1, 0, 8), after.narrow(1, 0, 8)));
  EXPECT_TRUE(at::allclose(before.narrow(1, 9, 3), after.narrow(1, 9, 3)));
}

TEST(Gemma3Model, TheExportsConfigAndRecordAreTheTables) {
  auto model = make_gemma("rope_scaling_factor: 8, query_pre_attn_scalar: 12");
  StateDict state;
  for (const auto& item : model->named_parameters()) state[item.key()] = item.value().detach();
  const nlohmann::json config = nlohmann::json::parse(model->hugging_face_export(state).config_json);
  EXPECT_EQ(config.at("model_type"), "gemma3_text");
  EXPECT_EQ(config.at("layer_types"),
            nlohmann::json({"sliding_attention", "full_attention", "sliding_attention", "full_attention"}));
  EXPECT_EQ(config.at("rope_parameters").at("full_attention").at("rope_type"), "linear");
  EXPECT_EQ(config.at("rope_parameters").at("full_attention").at("factor"), 8.0);
  EXPECT_EQ(config.at("rope_parameters").at("sliding_attention").at("rope_theta"), 10000.0);
  EXPECT_EQ(config.at("query_pre_attn_scalar"), 12);
  EXPECT_EQ(config.at("hidden_activation"), "gelu_pytorch_tanh");
  EXPECT_TRUE(config.at("attn_logit_softcapping").is_null());
  const nlohmann::json record = nlohmann::json::parse(model->architecture_json());
  EXPECT_EQ(record.at("head_dim"), kHeadDim);
  EXPECT_EQ(record.at("rope_scaling_factor"), 8.0);
}

// Gemma 2's final_logit_softcapping caps the logits the model gives (and the head the losses
// read carries the cap); without it they pass the cap.
TEST(Gemma3Model, TheFinalSoftcapBoundsTheLogits) {
  c10::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(kVocab, {2, 12}, at::kLong);
  auto capped = make_gemma("final_logit_softcapping: 0.01");
  EXPECT_LE(capped->forward(ids).abs().max().item<double>(), 0.01);
  EXPECT_DOUBLE_EQ(capped->output_head().logit_softcap, 0.01);
  EXPECT_GT(make_gemma()->forward(ids).abs().max().item<double>(), 0.01);
}

TEST(Gemma3Model, ConfigMistakesAreConfigIssues) {
  EXPECT_THROW(make_gemma("layer_types: [sliding_attention]"), ConfigError);
  EXPECT_THROW(make_gemma("layer_types: [sliding_attention, local, full_attention, full_attention]"), ConfigError);
  EXPECT_THROW(make_gemma("n_kv_head: 3"), ConfigError);
  EXPECT_THROW(make_gemma("final_logit_softcapping: -1"), ConfigError);
}

}  // namespace gemma3_text_test
}  // namespace tessera
