// model/gpt built through the real loader and factory at small sizes: shapes, causality, the tied
// head, parameter and FLOP counts, seeded init, dropout and the errors it raises.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <string>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "tessera/run/precision.hpp"
#include "autograd_graph.hpp"
#include "packed_documents.hpp"
#include "test_support.hpp"

namespace tessera {
namespace gpt_test {

using testing::build_components;
using testing::built;

constexpr std::int64_t kVocab = 32, kLayers = 2, kHeads = 2, kEmbd = 16, kMaxSeq = 8;

std::string gpt_yaml(const std::string& extra = "") {
  return "model: {component_key: model, variant_key: gpt, config: {vocab_size: 32, n_layer: 2, "
         "n_head: 2, n_embd: 16, max_seq_len: 8" +
         (extra.empty() ? "" : ", " + extra) + "}}\n";
}

// Builds a gpt after seeding the global generator, as the host does before building.
std::shared_ptr<Model> make_gpt(const std::string& extra = "", std::uint64_t seed = 1234) {
  core::seed_everything(seed, "cpu");
  auto components = build_components(gpt_yaml(extra));
  return built<Model>(components, "model");
}

at::Tensor tokens(std::vector<std::int64_t> ids, std::int64_t batch = 1) {
  const auto seq = static_cast<std::int64_t>(ids.size()) / batch;
  return at::tensor(ids, at::kLong).view({batch, seq});
}

at::Tensor param(Model& model, const std::string& name) { return model.named_parameters()[name]; }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(GptModel, LogitsHaveShapeBatchSeqVocab) {
  auto model = make_gpt();
  at::Tensor logits = model->forward(tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{2, 5, kVocab}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
  EXPECT_EQ(model->vocab_size(), kVocab);
  EXPECT_EQ(model->max_seq_len(), kMaxSeq);
}

TEST(GptModel, IsCausal) {
  auto model = make_gpt();
  const at::Tensor a = tokens({3, 1, 4, 1, 5, 9, 2, 6});
  at::Tensor b = a.clone();
  constexpr std::int64_t t = 5;
  b[0][t] = 17;
  const at::Tensor la = model->forward(a), lb = model->forward(b);
  // Positions before t cannot see token t; position t and later must.
  EXPECT_LE(max_abs_diff(la.slice(1, 0, t), lb.slice(1, 0, t)), 1e-6);
  for (std::int64_t s = t; s < kMaxSeq; ++s) {
    EXPECT_GT(max_abs_diff(la.select(1, s), lb.select(1, s)), 1e-4) << "position " << s;
  }
}

TEST(GptModel, BatchRowsAreIndependent) {
  auto model = make_gpt();
  const at::Tensor pair = tokens({1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1}, 2);
  const at::Tensor both = model->forward(pair);
  const at::Tensor first = model->forward(pair.slice(0, 0, 1));
  EXPECT_LE(max_abs_diff(both.slice(0, 0, 1), first), 1e-5);
}

TEST(GptModel, HeadIsTiedToTheTokenEmbedding) {
  auto model = make_gpt();
  // No separate head: only the token embedding has the [vocab, n_embd] shape.
  int vocab_by_embd = 0;
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.key().find("head"), std::string::npos) << item.key();
    if (item.value().sizes() == at::IntArrayRef{kVocab, kEmbd}) {
      ++vocab_by_embd;
      EXPECT_EQ(item.key(), "wte.weight");
    }
  }
  EXPECT_EQ(vocab_by_embd, 1);

  // Token 20 is not in the input, so its embedding row reaches the output only through the head:
  // changing it changes exactly the logits of token 20.
  const at::Tensor input = tokens({1, 2, 3, 4, 5, 6});
  const at::Tensor before = model->forward(input);
  {
    c10::NoGradGuard no_grad;
    // Not a constant shift: the final LayerNorm's output sums to zero, so a constant cancels.
    param(*model, "wte.weight")[20].add_(at::linspace(-1.0, 1.0, kEmbd));
  }
  const at::Tensor after = model->forward(input);
  EXPECT_GT(max_abs_diff(before.select(2, 20), after.select(2, 20)), 1e-3);
  at::Tensor others_before = at::cat({before.slice(2, 0, 20), before.slice(2, 21)}, 2);
  at::Tensor others_after = at::cat({after.slice(2, 0, 20), after.slice(2, 21)}, 2);
  EXPECT_LE(max_abs_diff(others_before, others_after), 1e-6);
}

TEST(GptModel, HeadGetsGradientThroughTheEmbedding) {
  auto model = make_gpt();
  model->forward(tokens({1, 2, 3, 4})).select(2, 25).sum().backward();
  // Token 25 is not in the input: only the tied head can give its embedding row a gradient.
  const at::Tensor grad = param(*model, "wte.weight").grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_GT(grad[25].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(grad[26].abs().sum().item<double>(), 0.0);
}

// Closed-form parameter count of this architecture (token and position embeddings, L blocks,
// final norm; the head is the token embedding).
std::int64_t expected_parameters(std::int64_t V, std::int64_t P, std::int64_t L, std::int64_t d, bool bias) {
  const std::int64_t block = bias ? 12 * d * d + 13 * d : 12 * d * d + 2 * d;
  return V * d + P * d + L * block + (bias ? 2 * d : d);
}

TEST(GptModel, ParameterCountMatchesTheClosedForm) {
  EXPECT_EQ(make_gpt()->num_parameters(), expected_parameters(kVocab, kMaxSeq, kLayers, kEmbd, true));
  auto no_bias = make_gpt("bias: false");
  EXPECT_EQ(no_bias->num_parameters(), expected_parameters(kVocab, kMaxSeq, kLayers, kEmbd, false));
  for (const auto& item : no_bias->named_parameters()) {
    EXPECT_EQ(item.key().find("bias"), std::string::npos) << item.key();
  }
}

TEST(GptModel, ParameterNamesFollowGpt2) {
  auto model = make_gpt();
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) names.insert(item.key());
  for (const char* name : {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "h.0.ln_1.weight",
                           "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight",
                           "h.0.ln_2.bias", "h.1.mlp.c_fc.weight", "h.1.mlp.c_proj.bias"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  EXPECT_EQ(names.count("h.2.ln_1.weight"), 0u);
}

TEST(GptModel, FlopsPerTokenIsSixNPlusAttention) {
  auto model = make_gpt();
  const double n_no_pos = static_cast<double>(model->num_parameters() - kMaxSeq * kEmbd);
  for (std::int64_t T : {1, 4, 8}) {
    EXPECT_DOUBLE_EQ(model->flops_per_token(T), 6.0 * n_no_pos + 12.0 * kLayers * kEmbd * T) << "T=" << T;
  }
}

TEST(GptModel, SameSeedGivesTheSameWeights) {
  auto a = make_gpt("", 7), b = make_gpt("", 7), c = make_gpt("", 8);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(pa[i].equal(pb[i])) << "parameter " << i;
    any_differs = any_differs || !pa[i].equal(pc[i]);
  }
  EXPECT_TRUE(any_differs) << "another seed should give other weights";
}

TEST(GptModel, InitFollowsGpt2) {
  core::seed_everything(3, "cpu");
  auto b = build_components(
      "model: {component_key: model, variant_key: gpt, config: {vocab_size: 256, n_layer: 2, n_head: 2, "
      "n_embd: 32, max_seq_len: 64, init_std: 0.05}}\n");
  auto model = built<Model>(b, "model");
  auto std_of = [&](const std::string& name) { return param(*model, name).std().item<double>(); };
  EXPECT_NEAR(std_of("wte.weight"), 0.05, 0.005);
  EXPECT_NEAR(std_of("h.0.attn.c_attn.weight"), 0.05, 0.005);
  EXPECT_NEAR(std_of("h.1.mlp.c_fc.weight"), 0.05, 0.005);
  // Residual projections are scaled by 1/sqrt(2 n_layer) = 1/2.
  EXPECT_NEAR(std_of("h.0.attn.c_proj.weight"), 0.025, 0.003);
  EXPECT_NEAR(std_of("h.1.mlp.c_proj.weight"), 0.025, 0.003);
  EXPECT_TRUE(param(*model, "h.0.attn.c_attn.bias").eq(0).all().item<bool>());
  EXPECT_TRUE(param(*model, "h.1.mlp.c_proj.bias").eq(0).all().item<bool>());
  EXPECT_TRUE(param(*model, "h.0.ln_1.weight").eq(1).all().item<bool>());
  EXPECT_TRUE(param(*model, "ln_f.bias").eq(0).all().item<bool>());
}

TEST(GptModel, DropoutActsOnlyInTrainingMode) {
  auto plain = make_gpt("", 5);
  auto dropped = make_gpt("dropout: 0.5", 5);  // same seed: the same weights
  const at::Tensor input = tokens({1, 2, 3, 4, 5, 6, 7, 8});
  dropped->train();
  EXPECT_GT(max_abs_diff(dropped->forward(input), dropped->forward(input)), 1e-4);
  dropped->eval();
  plain->eval();
  EXPECT_TRUE(dropped->forward(input).equal(dropped->forward(input)));
  EXPECT_LE(max_abs_diff(dropped->forward(input), plain->forward(input)), 1e-6);
}

TEST(GptModel, SequenceLongerThanMaxSeqLenThrows) {
  auto model = make_gpt();
  EXPECT_NO_THROW(model->forward(at::zeros({1, kMaxSeq}, at::kLong)));
  try {
    model->forward(at::zeros({1, kMaxSeq + 1}, at::kLong));
    FAIL() << "expected tessera::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds max_seq_len 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model->forward(at::zeros({kMaxSeq}, at::kLong)), Error);
}

TEST(GptModel, EmbdNotDivisibleByHeadsIsAConfigIssueAtBuild) {
  try {
    build_components("model: {component_key: model, variant_key: gpt, config: {n_head: 3, n_embd: 16}}\n");
    FAIL() << "expected a ConfigIssue";
  } catch (const core::ConfigIssue& e) {
    EXPECT_EQ(e.path(), "components.model.config.n_embd");
    EXPECT_NE(e.message().find("n_embd (16) must be divisible by n_head (3)"), std::string::npos) << e.what();
  }
}

}  // namespace gpt_test
}  // namespace tessera

namespace tessera {
namespace gpt_test {

// Loss, and every parameter's gradient, of one training forward and backward.
struct Gradients {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
  int checkpointed_blocks = 0;  // checkpoint nodes in the backward graph
};

Gradients loss_and_gradients(Model& model, const at::Tensor& input, std::uint64_t dropout_seed) {
  core::seed_everything(dropout_seed, "cpu");
  model.train();
  model.zero_grad();
  const at::Tensor logits = model.forward(input);
  const at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), input.reshape({-1}));
  Gradients out;
  out.checkpointed_blocks = testing::count_graph_nodes(loss, "CheckpointFunction");
  loss.backward();
  out.loss = loss.item<double>();
  for (const auto& item : model.named_parameters()) out.grads[item.key()] = item.value().grad().clone();
  return out;
}

// Recomputing blocks in backward changes nothing a user can see: with dropout, the loss and every
// gradient equal the plain run's bit for bit (the dropout masks are drawn again from the saved
// generator state), for every block or every second one; and the random stream after the step is
// the plain run's too.
TEST(GptModel, ActivationCheckpointingGivesIdenticalGradients) {
  const at::Tensor input = tokens({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3}, 2);
  auto plain = make_gpt("dropout: 0.2");
  const Gradients expected = loss_and_gradients(*plain, input, 77);
  EXPECT_EQ(expected.checkpointed_blocks, 0);
  const double after_plain = at::rand({1}).item<double>();
  for (const std::string every : {"1", "2"}) {
    SCOPED_TRACE("every " + every);
    auto checkpointed = make_gpt("dropout: 0.2, activation_checkpointing: true, activation_checkpointing_every: " + every);
    const Gradients got = loss_and_gradients(*checkpointed, input, 77);
    // Two blocks: both recomputed with every 1, block 0 alone with every 2.
    EXPECT_EQ(got.checkpointed_blocks, every == "1" ? 2 : 1);
    EXPECT_EQ(at::rand({1}).item<double>(), after_plain) << "the recomputation moved the generator";
    EXPECT_EQ(got.loss, expected.loss);
    ASSERT_EQ(got.grads.size(), expected.grads.size());
    for (const auto& [name, grad] : expected.grads) {
      EXPECT_TRUE(got.grads.at(name).equal(grad)) << name << " differs by " << max_abs_diff(got.grads.at(name), grad);
    }
  }
  // Dropout really draws masks here: another seed gives another loss.
  EXPECT_NE(loss_and_gradients(*plain, input, 78).loss, expected.loss);
}

// Under bf16 autocast the recomputation runs in bf16 as the forward did: the gradients equal
// those of the plain bf16 run.
TEST(GptModel, ActivationCheckpointingKeepsTheAutocastOfTheForwardPass) {
  const at::Tensor input = tokens({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3}, 2);
  auto run = [&](const std::string& extra) {
    auto model = make_gpt(extra);
    core::seed_everything(5, "cpu");
    model->zero_grad();
    at::Tensor loss;
    {
      AutocastGuard autocast(c10::Device(c10::kCPU), "bf16");
      const at::Tensor logits = model->forward(input);
      EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
      loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), input.reshape({-1}));
    }
    loss.backward();
    return model->named_parameters()["h.0.mlp.c_fc.weight"].grad().clone();
  };
  const at::Tensor plain = run("dropout: 0.1");
  const at::Tensor checkpointed = run("dropout: 0.1, activation_checkpointing: true");
  EXPECT_EQ(plain.scalar_type(), at::kFloat);
  EXPECT_TRUE(checkpointed.equal(plain)) << max_abs_diff(checkpointed, plain);
}

// The hidden states and the tied head are the logits taken apart.
TEST(GptModel, HiddenStatesThroughTheOutputHeadAreTheLogits) {
  auto model = make_gpt();
  ASSERT_TRUE(model->has_output_head());
  const at::Tensor input = tokens({3, 1, 4, 1, 5, 9, 2, 6});
  const OutputHead head = model->output_head();
  EXPECT_TRUE(head.weight.is_same(param(*model, "wte.weight")));
  const at::Tensor hidden = model->forward_hidden(input);
  EXPECT_EQ(hidden.sizes(), (at::IntArrayRef{1, 8, kEmbd}));
  EXPECT_TRUE(at::linear(hidden, head.weight).equal(model->forward(input)));
}

// Packed documents are computed as if alone (tests/support/packed_documents.hpp).
// The Hugging Face export's end-of-text id: GPT-2's 50256 where the vocabulary is GPT-2's (50257,
// or padded to 50304), none for another vocabulary (a guess there would stop generation anywhere).
TEST(GptModel, HuggingFaceExportNamesGpt2sEndOfTextOnlyForItsVocabulary) {
  for (const auto& [vocab, expected] : std::map<std::int64_t, std::int64_t>{{50257, 50256}, {50304, 50256}, {40, -1}, {128256, -1}}) {
    SCOPED_TRACE(vocab);
    auto components = build_components("model: {component_key: model, variant_key: gpt, config: {vocab_size: " +
                                       std::to_string(vocab) + ", n_layer: 1, n_head: 2, n_embd: 8, max_seq_len: 4}}\n");
    auto model = testing::built<Model>(components, "model");
    StateDict state;
    for (const auto& item : model->named_parameters()) state[item.key()] = item.value().detach();
    const auto config = nlohmann::json::parse(model->hugging_face_export(state).config_json);
    if (expected < 0) {
      EXPECT_TRUE(config["eos_token_id"].is_null());
    } else {
      EXPECT_EQ(config["eos_token_id"], expected);
      EXPECT_EQ(config["bos_token_id"], expected);
    }
  }
}

TEST(GptModel, PackedDocumentsAreComputedAsIfAlone) {
  auto model = make_gpt();
  testing::expect_packed_documents_computed_alone(*model);
}

}  // namespace gpt_test
}  // namespace tessera
