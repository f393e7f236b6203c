// adapter/lora built through the real loader and factory over a real model/llama: the adapted
// model starts as the base, only A and B get gradients, merging gives the adapted model's logits,
// all-linear leaves the output head and the MoE router alone, and the PEFT export names the
// layers as PEFT does.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "tessera/components/adapter.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"
#include "tessera/nn/linear.hpp"
#include "test_support.hpp"

namespace tessera {
namespace lora_test {

using testing::build_components;
using testing::built;

std::string llama(const std::string& extra = "") {
  return "model: {component_key: model, variant_key: llama, config: {vocab_size: 64, n_layer: 2, n_head: 4, "
         "n_kv_head: 2, n_embd: 32, intermediate_size: 48, max_seq_len: 16, tie_embeddings: false" + extra + "}}\n";
}
const std::string kLlama = llama();

std::string lora(const std::string& config) {
  return "adapters: [{component_key: adapter, variant_key: lora, config: " + config + "}]\n";
}

struct Adapted {
  core::BuiltComponents components;
  std::shared_ptr<Model> model;
};

// The same base weights whatever follows the model: the model draws its init seed first.
Adapted build(const std::string& yaml) {
  core::seed_everything(7, "cpu");
  Adapted a{build_components(yaml), nullptr};
  a.model = built<Model>(a.components, "model");
  return a;
}

at::Tensor ids() { return at::arange(24, at::kLong).remainder(64).view({2, 12}); }

std::shared_ptr<Adapter> adapter_of(Adapted& a) {
  return std::static_pointer_cast<Adapter>(a.components.lists.at("adapters").at(0).object);
}

// loss/dpo's reference: while AdaptersOff lives, the adapted model computes the base's logits.
TEST(LoraAdapter, AdaptersOffGivesTheBasesLogits) {
  Adapted base = build(kLlama);
  Adapted adapted = build(kLlama + lora("{rank: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}"));
  {
    at::NoGradGuard no_grad;
    for (auto& item : adapted.model->named_parameters()) {
      if (item.key().find(".lora_B") != std::string::npos) item.value().normal_();
    }
  }
  const at::Tensor with_adapters = adapted.model->forward(ids());
  EXPECT_FALSE(at::allclose(with_adapters, base.model->forward(ids()))) << "B mattered";
  {
    AdaptersOff reference;
    EXPECT_TRUE(AdaptersOff::active());
    EXPECT_TRUE(at::equal(adapted.model->forward(ids()), base.model->forward(ids())));
  }
  EXPECT_FALSE(AdaptersOff::active());
  EXPECT_TRUE(at::equal(adapted.model->forward(ids()), with_adapters));
}

TEST(LoraAdapter, StartsAsTheBaseAndOnlyItsMatricesGetGradients) {
  Adapted base = build(kLlama);
  Adapted adapted = build(kLlama + lora("{rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}"));
  EXPECT_TRUE(at::equal(base.model->forward(ids()), adapted.model->forward(ids()))) << "B starts at zero";

  const auto params = adapted.model->named_parameters();
  ASSERT_NE(params.find("layers.1.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(params["layers.1.self_attn.v_proj.lora_B.weight"].sizes(), (at::IntArrayRef{16, 4}));
  EXPECT_EQ(params.find("layers.0.self_attn.k_proj.lora_A.weight"), nullptr) << "k_proj is not a target";
  EXPECT_EQ(adapted.components.adapter_parameters.size(), 8u);  // 2 layers x 2 targets x (A, B)
  EXPECT_EQ(adapted.model->num_parameters(), 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4));

  adapted.model->forward(ids()).square().mean().backward();
  for (const auto& item : params) {
    const bool mine = item.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(item.value().requires_grad(), mine) << item.key();
    EXPECT_EQ(item.value().grad().defined(), mine) << item.key();
  }
  // With B zero only B learns first: A's gradient goes through B.
  EXPECT_GT(params["layers.0.self_attn.q_proj.lora_B.weight"].grad().abs().sum().item<double>(), 0);
  EXPECT_EQ(params["layers.0.self_attn.q_proj.lora_A.weight"].grad().abs().sum().item<double>(), 0);
}

// Whatever order the spec lists them in, the optimizer (which takes the model by reference) is
// built after the adapters and sees their parameters alone.
TEST(LoraAdapter, TheOptimizerGetsTheAdaptedModelWhateverTheSpecsOrder) {
  Adapted a = build(lora("{rank: 2, target_modules: [o_proj]}") +
                    "optimizer: {component_key: optimizer, variant_key: adamw, config: {model: {instance_key: model}}}\n" +
                    kLlama);
  const auto optimizer = built<Optimizer>(a.components, "optimizer");
  ASSERT_EQ(optimizer->parameters().size(), 4u);  // 2 layers x (A, B)
  for (const auto& p : optimizer->parameters()) EXPECT_EQ(p.dim(), 2);
  EXPECT_EQ(a.model->named_parameters()["layers.1.self_attn.o_proj.lora_B.weight"].data_ptr(),
            optimizer->parameters()[3].data_ptr());
}

TEST(LoraAdapter, MergedWeightsGiveTheAdaptedModelsLogits) {
  Adapted adapted = build(kLlama + lora("{rank: 2, alpha: 6, target_modules: [all-linear]}"));
  {
    c10::NoGradGuard no_grad;
    for (auto& item : adapted.model->named_parameters()) {
      if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0, 0.5);
    }
  }
  const at::Tensor expected = adapted.model->forward(ids());
  StateDict state;
  for (const auto& item : adapted.model->named_parameters()) state[item.key()] = item.value().detach().clone();
  adapter_of(adapted)->merge(state);
  for (const auto& [name, tensor] : state) EXPECT_EQ(name.find("lora_"), std::string::npos) << name;

  Adapted plain = build(kLlama);
  {
    c10::NoGradGuard no_grad;
    for (auto& item : plain.model->named_parameters()) item.value().copy_(state.at(item.key()));
  }
  const at::Tensor merged = plain.model->forward(ids());
  EXPECT_TRUE(at::allclose(merged, expected, 1e-5, 1e-5)) << (merged - expected).abs().max().item<double>();
  EXPECT_FALSE(at::allclose(merged, build(kLlama).model->forward(ids()), 1e-3, 1e-3)) << "B mattered";
}

// The first block's input (the frozen embeddings') needs no gradient, its adapters do: a
// checkpointed block must still give them theirs, the same as without checkpointing.
TEST(LoraAdapter, CheckpointedBlocksGiveTheAdaptersTheirGradients) {
  std::map<std::string, at::Tensor> grads[2];
  for (const bool checkpointed : {false, true}) {
    Adapted a = build(llama(checkpointed ? ", activation_checkpointing: true" : "") +
                      lora("{rank: 2, alpha: 2, dropout: 0.2, target_modules: [all-linear]}"));
    {
      c10::NoGradGuard no_grad;
      for (auto& item : a.model->named_parameters()) {
        if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0, 0.5);
      }
    }
    at::manual_seed(3);  // the same dropout masks
    a.model->train();
    a.model->forward(ids()).square().mean().backward();
    for (const auto& item : a.model->named_parameters()) {
      if (item.value().requires_grad()) grads[checkpointed][item.key()] = item.value().grad();
    }
  }
  ASSERT_EQ(grads[0].size(), 2u * 2 * 7);  // 2 blocks x 7 projections x (A, B)
  for (const auto& [name, grad] : grads[0]) {
    ASSERT_TRUE(grads[1][name].defined()) << name << ": no gradient under checkpointing";
    EXPECT_TRUE(at::allclose(grads[1][name], grad, 1e-6, 1e-7)) << name;
  }
}

TEST(LoraAdapter, AllLinearLeavesTheOutputHeadAndTheRouterAlone) {
  const std::string moe =
      "model: {component_key: model, variant_key: llama, config: {vocab_size: 64, n_layer: 1, n_head: 4, "
      "n_embd: 32, intermediate_size: 48, max_seq_len: 16, num_experts: 4, tie_embeddings: false}}\n";
  Adapted a = build(moe + lora("{target_modules: [all-linear]}"));
  std::vector<std::string> adapted;
  for (const auto& name : a.components.adapter_parameters) {
    if (name.find("lora_A") != std::string::npos) adapted.push_back(name.substr(0, name.find(".lora_A")));
  }
  EXPECT_EQ(adapted, (std::vector<std::string>{"layers.0.self_attn.k_proj", "layers.0.self_attn.o_proj",
                                               "layers.0.self_attn.q_proj", "layers.0.self_attn.v_proj"}));
  for (const char* layer : {"gate", "lm_head"}) {
    try {
      build(moe + lora(std::string("{target_modules: [") + layer + "]}"));
      ADD_FAILURE() << layer << " was adapted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("reads directly"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("components.adapters[0].config.target_modules"), std::string::npos)
          << e.what();
    }
  }
}

TEST(LoraAdapter, ThePeftExportNamesLayersAsPeftDoes) {
  Adapted a = build(kLlama + lora("{rank: 4, alpha: 8, target_modules: [q_proj]}"));
  StateDict state;
  for (const auto& item : a.model->named_parameters()) state[item.key()] = item.value().detach();
  const PeftExport peft = adapter_of(a)->peft_export(*a.model, state, "/models/base");
  EXPECT_EQ(peft.tensors.size(), 4u);
  EXPECT_TRUE(peft.tensors.count("base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"));
  const nlohmann::json config = nlohmann::json::parse(peft.adapter_config_json);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["target_modules"], nlohmann::json::array({"q_proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], "/models/base");
  EXPECT_EQ(config["fan_in_fan_out"], false);
}

}  // namespace lora_test
}  // namespace tessera
