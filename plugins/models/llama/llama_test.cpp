// model/llama built through the real loader and factory at small sizes: shapes, causality,
// grouped-query attention against repeated key/value heads, tied and untied heads, FLOPs, the
// init, deferred (sharded) init equal to the model built whole, activation checkpointing, bf16,
// the Hugging Face export's names and config, Tessera exports read back, and config errors; with
// num_experts (Mixtral) the experts' FLOPs, routing statistics and auxiliary loss, checkpointing,
// deferred init and the export's one tensor per expert.
// (Agreement with transformers itself is tests/integration/hf_interop_test.cpp.)
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/core/checkpoint/checkpoint_settings.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/run/precision.hpp"
#include "tessera/formats/safetensors.hpp"
#include "packed_documents.hpp"
#include "test_support.hpp"

namespace tessera {
namespace llama_test {

using testing::build_components;
using testing::built;

constexpr std::int64_t kVocab = 32, kLayers = 2, kEmbd = 16, kMaxSeq = 8;

// 4 query heads sharing 2 key/value heads unless `extra` sets n_kv_head.
std::string llama_yaml(const std::string& extra = "") {
  const std::string kv = extra.find("n_kv_head") == std::string::npos ? "n_kv_head: 2, " : "";
  return "model: {component_key: model, variant_key: llama, config: {vocab_size: 32, n_layer: 2, n_head: 4, " + kv +
         "n_embd: 16, intermediate_size: 40, max_seq_len: 8" + (extra.empty() ? "" : ", " + extra) + "}}\n";
}

std::shared_ptr<Model> make_llama(const std::string& extra = "", std::uint64_t seed = 1234) {
  core::seed_everything(seed, "cpu");
  auto components = build_components(llama_yaml(extra));
  return built<Model>(components, "model");
}

// The model's parameters by name, as its state dict (detached views).
StateDict state_of(const Model& model) {
  StateDict state;
  for (const auto& item : model.named_parameters()) state[item.key()] = item.value().detach();
  return state;
}

at::Tensor tokens(std::int64_t batch, std::int64_t seq, std::uint64_t seed = 5) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(kVocab, {batch, seq}, g, at::kLong);
}

at::Tensor param(Model& model, const std::string& name) { return model.named_parameters()[name]; }

TEST(LlamaModel, LogitsHaveShapeBatchSeqVocab) {
  auto model = make_llama();
  const at::Tensor logits = model->forward(tokens(2, 5));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{2, 5, kVocab}));
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
}

TEST(LlamaModel, IsCausal) {
  auto model = make_llama();
  model->eval();
  at::Tensor a = tokens(1, 8), b = a.clone();
  b[0][6] = (b[0][6].item<std::int64_t>() + 1) % kVocab;
  const at::Tensor la = model->forward(a), lb = model->forward(b);
  EXPECT_TRUE(at::allclose(la.narrow(1, 0, 6), lb.narrow(1, 0, 6), 0, 1e-6)) << "a later token changed earlier logits";
  EXPECT_FALSE(at::allclose(la.narrow(1, 6, 2), lb.narrow(1, 6, 2), 0, 1e-6));
}

TEST(LlamaModel, ParametersFollowHuggingFaceNamesAndGroupedQueryShapes) {
  auto model = make_llama();
  const auto params = model->named_parameters();
  // 4 query heads of 4, 2 key/value heads of 4.
  EXPECT_EQ(params["layers.0.self_attn.q_proj.weight"].sizes(), (at::IntArrayRef{16, 16}));
  EXPECT_EQ(params["layers.0.self_attn.k_proj.weight"].sizes(), (at::IntArrayRef{8, 16}));
  EXPECT_EQ(params["layers.1.self_attn.v_proj.weight"].sizes(), (at::IntArrayRef{8, 16}));
  EXPECT_EQ(params["layers.1.mlp.gate_proj.weight"].sizes(), (at::IntArrayRef{40, 16}));
  EXPECT_EQ(params["layers.1.mlp.down_proj.weight"].sizes(), (at::IntArrayRef{16, 40}));
  EXPECT_TRUE(params.contains("lm_head.weight"));
  EXPECT_TRUE(params.contains("norm.weight"));
  for (const auto& item : params) EXPECT_EQ(item.key().find("bias"), std::string::npos) << item.key();
  // Tied: no lm_head, the embedding is the head.
  auto tied = make_llama("tie_embeddings: true");
  EXPECT_FALSE(tied->named_parameters().contains("lm_head.weight"));
  EXPECT_EQ(tied->num_parameters(), model->num_parameters() - kVocab * kEmbd);
  EXPECT_TRUE(tied->output_head().weight.is_same(param(*tied, "embed_tokens.weight")));
}

// Grouped-query attention equals full attention with each key/value head repeated for its group.
TEST(LlamaModel, GroupedQueryAttentionEqualsRepeatedKeyValueHeads) {
  auto grouped = make_llama();
  auto full = make_llama("n_kv_head: 4");
  c10::NoGradGuard no_grad;
  for (const auto& item : grouped->named_parameters()) {
    at::Tensor target = param(*full, item.key());
    const bool kv = item.key().find("k_proj") != std::string::npos || item.key().find("v_proj") != std::string::npos;
    // [2 heads x 4, 16] -> [4 heads x 4, 16]: heads 0,1 use kv head 0; heads 2,3 kv head 1.
    target.copy_(kv ? item.value().view({2, 1, 4, 16}).expand({2, 2, 4, 16}).reshape({16, 16}) : item.value());
  }
  grouped->eval();
  full->eval();
  const at::Tensor input = tokens(2, 8);
  EXPECT_TRUE(at::allclose(grouped->forward(input), full->forward(input), 1e-5, 1e-5));
}

TEST(LlamaModel, FlopsPerTokenIsSixNPlusAttention) {
  auto model = make_llama();
  // The separate input embedding is a lookup: not counted; the head is.
  const double n = static_cast<double>(model->num_parameters() - kVocab * kEmbd);
  EXPECT_DOUBLE_EQ(model->flops_per_token(8), 6.0 * n + 12.0 * kLayers * 16 * 8);
}

TEST(LlamaModel, InitScalesResidualProjectionsAndSetsNormsToOne) {
  core::seed_everything(3, "cpu");
  auto b = build_components(
      "model: {component_key: model, variant_key: llama, config: {vocab_size: 256, n_layer: 2, n_head: 2, "
      "n_embd: 64, intermediate_size: 128, max_seq_len: 8, init_std: 0.05}}\n");
  auto model = built<Model>(b, "model");
  auto std_of = [&](const std::string& name) { return param(*model, name).std().item<double>(); };
  EXPECT_NEAR(std_of("embed_tokens.weight"), 0.05, 0.005);
  EXPECT_NEAR(std_of("layers.0.self_attn.q_proj.weight"), 0.05, 0.005);
  EXPECT_NEAR(std_of("layers.1.self_attn.o_proj.weight"), 0.025, 0.003);
  EXPECT_NEAR(std_of("layers.1.mlp.down_proj.weight"), 0.025, 0.003);
  EXPECT_TRUE(param(*model, "layers.0.input_layernorm.weight").eq(1).all().item<bool>());
  EXPECT_TRUE(param(*model, "norm.weight").eq(1).all().item<bool>());
}

// Built as the host builds it (meta parameters), given storage and initialised in another
// order: exactly the weights of the model built whole.
TEST(LlamaModel, DeferredInitGivesTheWeightsOfTheModelBuiltWhole) {
  auto whole = make_llama("", 11);
  core::seed_everything(11, "cpu");
  std::shared_ptr<Model> deferred;
  {
    DeferredInitScope scope;
    auto components = build_components(llama_yaml());
    deferred = built<Model>(components, "model");
  }
  ASSERT_TRUE(deferred->has_deferred_parameters());
  std::vector<at::Tensor> params = deferred->parameters();
  for (const at::Tensor& p : params) materialize_parameter(p, at::empty(p.sizes(), at::kFloat));
  std::reverse(params.begin(), params.end());
  deferred->initialize_parameters(params);
  const auto expected = whole->named_parameters();
  for (const auto& item : deferred->named_parameters()) {
    EXPECT_TRUE(item.value().equal(expected[item.key()])) << item.key();
  }
}

TEST(LlamaModel, ActivationCheckpointingGivesIdenticalGradients) {
  const at::Tensor input = tokens(2, 8);
  auto gradients = [&](const std::string& extra) {
    auto model = make_llama(extra, 21);
    at::Tensor logits = model->forward(input.narrow(1, 0, 7));
    at::cross_entropy_loss(logits.flatten(0, 1), input.narrow(1, 1, 7).flatten()).backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad().clone();
    return grads;
  };
  const auto plain = gradients(""), checkpointed = gradients("activation_checkpointing: true");
  for (const auto& [name, grad] : plain) EXPECT_TRUE(checkpointed.at(name).equal(grad)) << name;
}

TEST(LlamaModel, Bf16AutocastStaysCloseToFp32) {
  auto model = make_llama();
  model->eval();
  const at::Tensor input = tokens(2, 8);
  const at::Tensor fp32 = model->forward(input);
  at::Tensor bf16;
  {
    AutocastGuard autocast(c10::Device(c10::kCPU), "bf16");
    bf16 = model->forward(input);
  }
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_LT((bf16.to(at::kFloat) - fp32).abs().max().item<double>(), 0.1);
}

TEST(LlamaModel, HuggingFaceExportNamesAndConfig) {
  auto model = make_llama("rope_theta: 500000.0, rope_scaling: [8.0, 1.0, 4.0, 16]");
  const StateDict state = state_of(*model);
  ASSERT_TRUE(model->exports_hugging_face());
  const HfExport out = model->hugging_face_export(state);
  EXPECT_TRUE(out.tensors.count("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_TRUE(out.tensors.count("model.embed_tokens.weight"));
  EXPECT_TRUE(out.tensors.count("lm_head.weight"));
  EXPECT_EQ(out.tensors.size(), state.size());
  const auto config = nlohmann::json::parse(out.config_json);
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["intermediate_size"], 40);
  EXPECT_EQ(config["rope_theta"], 500000.0);
  EXPECT_EQ(config["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(config["tie_word_embeddings"], false);
  // Not imported: no special token ids are known, so none is written (transformers would
  // otherwise assume a Llama's bos 1 and eos 2).
  EXPECT_TRUE(config["bos_token_id"].is_null());
  EXPECT_TRUE(config["eos_token_id"].is_null());
}

// The special token ids of an imported Hugging Face folder (Llama 3.1's eos is a list) travel
// into the model's own Hugging Face export.
TEST(LlamaModel, AnImportsSpecialTokenIdsTravelIntoItsExport) {
  testing::TempDir dir;
  auto model = make_llama();
  const StateDict state = state_of(*model);
  HfExport folder = model->hugging_face_export(state);
  nlohmann::json config = nlohmann::json::parse(folder.config_json);
  config["bos_token_id"] = 3;
  config["eos_token_id"] = {5, 7};
  config["pad_token_id"] = 0;
  folder.config_json = config.dump();
  write_hf_checkpoint(dir.path().string(), folder, 1'000'000);
  auto again = build_components("model: {component_key: model, variant_key: llama, config: {init_from: " +
                                dir.path().string() + "}}\n");
  auto imported = built<Model>(again, "model");
  const auto exported = nlohmann::json::parse(imported->hugging_face_export(state_of(*imported)).config_json);
  EXPECT_EQ(exported["bos_token_id"], 3);
  EXPECT_EQ(exported["eos_token_id"], nlohmann::json({5, 7}));
  EXPECT_EQ(exported["pad_token_id"], 0);
}

TEST(LlamaModel, RopeScalingChangesOnlyLongWavelengths) {
  auto plain = make_llama("", 4), scaled = make_llama("rope_scaling: [8.0, 1.0, 4.0, 4]", 4);
  plain->eval();
  scaled->eval();
  const at::Tensor input = tokens(1, 8);
  // Same weights, different rotary frequencies: different logits past the first position.
  EXPECT_FALSE(at::allclose(plain->forward(input), scaled->forward(input), 1e-5, 1e-5));
  // Position 0 is not rotated at all.
  EXPECT_TRUE(at::allclose(plain->forward(input).select(1, 0), scaled->forward(input).select(1, 0), 1e-6, 1e-6));
}

TEST(LlamaModel, ReadsBackATesseraExport) {
  testing::TempDir dir;
  auto model = make_llama("", 9);
  const StateDict state = state_of(*model);
  write_safetensors(dir.file("model.safetensors"), state);
  auto again = build_components(llama_yaml("init_from: " + dir.path().string()));
  auto loaded = built<Model>(again, "model");
  for (const auto& item : loaded->named_parameters()) EXPECT_TRUE(item.value().equal(state.at(item.key()))) << item.key();
}

// A Tessera export folder's config.json settles what the YAML leaves out: rope_theta changes no
// weight's shape, so without it the weights would load into a model rotating otherwise.
TEST(LlamaModel, AnExportsConfigSettlesWhatTheYamlLeavesOut) {
  testing::TempDir dir;
  auto model = make_llama("rope_theta: 500000.0", 9);
  const StateDict state = state_of(*model);
  write_safetensors(dir.file("model.safetensors"), state);
  std::ofstream(dir.file("config.json"))
      << R"({"component_key": "model", "variant_key": "llama", "config": {"vocab_size": 32, "n_layer": 2, "n_head": 4,)"
      << R"( "n_kv_head": 2, "n_embd": 16, "intermediate_size": 40, "max_seq_len": 8, "rope_theta": 500000.0}})";
  auto again = build_components("model: {component_key: model, variant_key: llama, config: {init_from: " +
                                dir.path().string() + "}}\n");
  auto loaded = built<Model>(again, "model");
  model->eval();
  loaded->eval();
  const at::Tensor input = tokens(1, 8);
  EXPECT_TRUE(at::allclose(loaded->forward(input), model->forward(input), 1e-6, 1e-6));
  auto message = [&](const std::string& fields) {
    try {
      build_components("model: {component_key: model, variant_key: llama, config: {" + fields +
                       "init_from: " + dir.path().string() + "}}\n");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("rope_theta: 10000.0, ").find("the YAML says rope_theta: 10000 but"), std::string::npos)
      << message("rope_theta: 10000.0, ");
  // 0 means n_head (4) here, the export has 2 key/value heads; its head_dim 16 / 4 = 4 agrees.
  EXPECT_NE(message("n_kv_head: 0, ").find("the YAML says n_kv_head: 4 but"), std::string::npos)
      << message("n_kv_head: 0, ");
  EXPECT_EQ(message("head_dim: 4, n_kv_head: 2, "), "no error");
}

// A model's own export, its config completed by architecture_json (effective head counts, sizes,
// rope_scaling), reads back under the same YAML, explicit zeros included; an export whose run
// took its architecture from init_from still settles rope_scaling (null: none).
TEST(LlamaModel, ItsOwnExportReadsBackAndSettlesRopeScaling) {
  testing::TempDir dir;
  const std::string fields = "n_kv_head: 0, head_dim: 0, rope_scaling: [8.0, 1.0, 4.0, 16]";
  auto model = make_llama(fields, 9);
  write_safetensors(dir.file("model.safetensors"), state_of(*model));
  std::ofstream(dir.file("config.json")) << core::export_config_json(
      R"({"component_key": "model", "variant_key": "llama", "config": {"init_from": "/elsewhere"}})", model->architecture_json());
  const std::string with_init = ", init_from: " + dir.path().string();
  EXPECT_NO_THROW(build_components(llama_yaml(fields + with_init)));
  auto loaded = build_components("model: {component_key: model, variant_key: llama, config: {init_from: " +
                                 dir.path().string() + "}}\n");
  model->eval();
  auto again = built<Model>(loaded, "model");
  again->eval();
  EXPECT_TRUE(at::allclose(again->forward(tokens(1, 8)), model->forward(tokens(1, 8)), 1e-6, 1e-6));

  auto plain = make_llama("", 9);  // no rope_scaling: written as null
  const std::string other = dir.file("plain");
  std::filesystem::create_directories(other);
  write_safetensors(other + "/model.safetensors", state_of(*plain));
  std::ofstream(other + "/config.json") << core::export_config_json(
      R"({"component_key": "model", "variant_key": "llama", "config": {"init_from": "/elsewhere"}})", plain->architecture_json());
  try {
    build_components(llama_yaml("rope_scaling: [8.0, 1.0, 4.0, 16], init_from: " + other));
    ADD_FAILURE() << "rope_scaling against an export without it was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rope_scaling differs"), std::string::npos) << e.what();
  }
}

TEST(LlamaModel, ConfigMistakesAreConfigIssues) {
  auto message = [](const std::string& extra) {
    try {
      build_components(llama_yaml(extra));
    } catch (const core::ConfigIssue& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("n_kv_head: 3").find("multiple of n_kv_head"), std::string::npos) << message("n_kv_head: 3");
  EXPECT_NE(message("rope_scaling: [8.0, 1.0]").find("rope_scaling"), std::string::npos);
  EXPECT_NE(message("init_from: /nonexistent/model").find("init_from"), std::string::npos);
  EXPECT_NE(message("num_experts: 2, top_k: 3").find("top_k (3) must not exceed num_experts (2)"), std::string::npos);
}

// Mixtral: 4 SwiGLU experts of intermediate_size 40 per block, top-2.
const std::string kMixtral = "num_experts: 4, top_k: 2";

TEST(LlamaModel, MixtralBlocksRouteToStackedSwiGluExperts) {
  auto model = make_llama(kMixtral);
  EXPECT_EQ(param(*model, "layers.0.block_sparse_moe.gate.weight").sizes(), (at::IntArrayRef{4, kEmbd}));
  EXPECT_EQ(param(*model, "layers.1.block_sparse_moe.experts.w1.weight").sizes(), (at::IntArrayRef{4, 40, kEmbd}));
  EXPECT_EQ(param(*model, "layers.1.block_sparse_moe.experts.w2.weight").sizes(), (at::IntArrayRef{4, kEmbd, 40}));
  EXPECT_EQ(param(*model, "layers.1.block_sparse_moe.experts.w3.weight").sizes(), (at::IntArrayRef{4, 40, kEmbd}));
  EXPECT_FALSE(model->named_parameters().contains("layers.0.mlp.gate_proj.weight"));
  // 6 N_active + attention: a token passes through 2 of the 4 experts.
  const double idle = kLayers * 2 * 3 * kEmbd * 40;
  const double n = static_cast<double>(model->num_parameters() - kVocab * kEmbd) - idle;
  EXPECT_DOUBLE_EQ(model->flops_per_token(8), 6.0 * n + 12.0 * kLayers * 16 * 8);

  // Training forwards report each block's routing and give the router losses to the trainer.
  model->train();
  const at::Tensor logits = model->forward(tokens(2, 8));
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
  auto& routing = dynamic_cast<MoeRouting&>(*model);
  EXPECT_EQ(routing.num_experts(), 4);
  EXPECT_EQ(routing.experts_per_token(), 2);
  const auto stats = routing.take_router_statistics();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[1].layer, 1);
  EXPECT_EQ(stats[0].expert_assignments.sum().item<double>(), 2 * 8 * 2);
  EXPECT_EQ(stats[0].dropped_assignments.item<double>(), 0) << "no capacity limit";
  const at::Tensor aux = model->auxiliary_loss();
  ASSERT_TRUE(aux.defined());
  // 0.02 x (balance of block 0 + block 1), each at least 1 (1 when perfectly even).
  EXPECT_GE(aux.item<double>(), 0.02 * 2 - 1e-6);
  aux.backward();
  EXPECT_GT(param(*model, "layers.0.block_sparse_moe.gate.weight").grad().abs().sum().item<double>(), 0);
}

// An expert computes w2(silu(w1 x) * w3 x): with one expert of top-1 (gate weight 1), the block is
// the dense SwiGLU block with those weights.
TEST(LlamaModel, OneMixtralExpertIsTheDenseSwiGlu) {
  auto dense = make_llama("", 4);
  auto mixtral = make_llama("num_experts: 1, top_k: 1", 4);
  {
    c10::NoGradGuard no_grad;
    for (const auto& item : mixtral->named_parameters()) {
      const std::string& name = item.key();
      const std::string block = name.substr(0, name.find(".block_sparse_moe.") + 1);
      auto from = [&](const char* dense_name) { return param(*dense, block + dense_name).unsqueeze(0); };
      if (name.find(".experts.w1.") != std::string::npos) {
        item.value().copy_(from("mlp.gate_proj.weight"));
      } else if (name.find(".experts.w2.") != std::string::npos) {
        item.value().copy_(from("mlp.down_proj.weight"));
      } else if (name.find(".experts.w3.") != std::string::npos) {
        item.value().copy_(from("mlp.up_proj.weight"));
      } else if (name.find(".gate.") == std::string::npos) {
        item.value().copy_(param(*dense, name));
      }
    }
  }
  const at::Tensor input = tokens(2, 8);
  EXPECT_TRUE(at::allclose(mixtral->forward(input), dense->forward(input), 1e-5, 1e-6));
}

// Checkpointing recomputes the attention of a Mixtral block, not its routing: the same
// gradients (with the router losses) and statistics counted once.
TEST(LlamaModel, MixtralActivationCheckpointingGivesIdenticalGradientsAndCountsRoutingOnce) {
  const at::Tensor input = tokens(2, 8);
  auto run = [&](const std::string& extra) {
    auto model = make_llama(kMixtral + extra, 21);
    model->train();
    at::Tensor logits = model->forward(input.narrow(1, 0, 7));
    (at::cross_entropy_loss(logits.flatten(0, 1), input.narrow(1, 1, 7).flatten()) + model->auxiliary_loss()).backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad().clone();
    const auto stats = dynamic_cast<MoeRouting&>(*model).take_router_statistics();
    return std::make_pair(grads, stats[0].tokens.item<double>());
  };
  const auto [plain, plain_tokens] = run("");
  const auto [checkpointed, checkpointed_tokens] = run(", activation_checkpointing: true");
  for (const auto& [name, grad] : plain) EXPECT_TRUE(checkpointed.at(name).equal(grad)) << name;
  EXPECT_EQ(checkpointed_tokens, plain_tokens);
  EXPECT_EQ(plain_tokens, 2 * 7);
}

TEST(LlamaModel, MixtralDeferredInitGivesTheWeightsOfTheModelBuiltWhole) {
  auto whole = make_llama(kMixtral, 11);
  core::seed_everything(11, "cpu");
  std::shared_ptr<Model> deferred;
  {
    DeferredInitScope scope;
    auto components = build_components(llama_yaml(kMixtral));
    deferred = built<Model>(components, "model");
  }
  std::vector<at::Tensor> params = deferred->parameters();
  for (const at::Tensor& p : params) materialize_parameter(p, at::empty(p.sizes(), at::kFloat));
  std::reverse(params.begin(), params.end());
  deferred->initialize_parameters(params);
  const auto expected = whole->named_parameters();
  for (const auto& item : deferred->named_parameters()) {
    EXPECT_TRUE(item.value().equal(expected[item.key()])) << item.key();
  }
  // The experts' down projections are residual outputs: scaled like down_proj.
  EXPECT_LT(param(*whole, "layers.0.block_sparse_moe.experts.w2.weight").std().item<double>(),
            0.7 * param(*whole, "layers.0.block_sparse_moe.experts.w1.weight").std().item<double>());
}

// Mixtral's files hold one tensor per expert; the config is a MixtralForCausalLM's.
TEST(LlamaModel, MixtralExportsOneTensorPerExpert) {
  auto model = make_llama(kMixtral);
  const StateDict state = state_of(*model);
  const HfExport out = model->hugging_face_export(state);
  const at::Tensor stacked = state.at("layers.1.block_sparse_moe.experts.w3.weight");
  for (std::int64_t e = 0; e < 4; ++e) {
    const std::string name = "model.layers.1.block_sparse_moe.experts." + std::to_string(e) + ".w3.weight";
    ASSERT_TRUE(out.tensors.count(name)) << name;
    EXPECT_TRUE(out.tensors.at(name).equal(stacked[e]));
  }
  EXPECT_TRUE(out.tensors.count("model.layers.0.block_sparse_moe.gate.weight"));
  EXPECT_EQ(out.tensors.size(), state.size() + kLayers * 3 * 3);  // each stack of 4 became 4 tensors
  const auto config = nlohmann::json::parse(out.config_json);
  EXPECT_EQ(config["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["num_local_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["intermediate_size"], 40);
  EXPECT_FALSE(config.contains("mlp_bias"));
}

// Packed documents are computed as if alone (tests/support/packed_documents.hpp).
TEST(LlamaModel, PackedDocumentsAreComputedAsIfAlone) {
  auto model = make_llama();
  testing::expect_packed_documents_computed_alone(*model);
}

}  // namespace llama_test
}  // namespace tessera
