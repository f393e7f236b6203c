// model/gpt_moe built through the real loader and factory: shapes, active-parameter FLOPs, the
// balance and z-losses and capacity drops on hand-routed tiny cases, gradients of unused experts,
// training with the real trainer, and 2 Gloo ranks against 1 rank with twice the micro-batches.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <tuple>

#include <cmath>
#include <mutex>
#include <thread>

#include "tessera/run/communicator.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/components/strategy.hpp"
#include "gloo_ranks.hpp"
#include "autograd_graph.hpp"
#include "test_support.hpp"
#include "trainer_parts.hpp"
#include "gpt_family.hpp"
#include "tessera/core/checkpoint/checkpoint_settings.hpp"
#include "tessera/formats/safetensors.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/parallel/expert_parallel.hpp"

namespace tessera {
namespace gpt_moe_test {

using testing::build_components;
using testing::built;

constexpr std::int64_t kEmbd = 16, kExperts = 4;

// One block (attention and an MoE feed-forward), 4 experts, top-1, unless `extra` says otherwise.
std::string moe_yaml(std::string extra = "") {
  for (const char* key : {"n_layer: 1", "top_k: 1", "num_experts: 4"}) {
    const std::string name = std::string(key).substr(0, std::string(key).find(':'));
    if (extra.find(name) == std::string::npos) extra += (extra.empty() ? "" : ", ") + std::string(key);
  }
  return "model: {component_key: model, variant_key: gpt_moe, config: {vocab_size: 32, n_head: 2, n_embd: 16, "
         "max_seq_len: 16, " + extra + "}}\n";
}

std::shared_ptr<Model> make_moe(const std::string& extra = "", std::uint64_t seed = 1234) {
  core::seed_everything(seed, "cpu");
  return built<Model>(build_components(moe_yaml(extra)), "model");
}

MoeRouting& routing(Model& model) { return dynamic_cast<MoeRouting&>(model); }
at::Tensor param(Model& model, const std::string& name) { return model.named_parameters()[name]; }
at::Tensor ids(const std::vector<std::int64_t>& v) { return at::tensor(v, at::kLong).view({1, -1}); }

// Makes block 0's router send token t to expert t % E with logit `logit` (0 for the others):
// the attention adds nothing, positions embed to zero, token t embeds to the zero-mean vector
// u_(t%E) (+1 at 2e, -1 at 2e+1), and router row e is u_e scaled so u_e . LN(u_e) = logit.
void route_by_token(Model& model, double logit) {
  c10::NoGradGuard no_grad;
  for (const char* name : {"h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "wpe.weight"}) param(model, name).zero_();
  const at::Tensor wte = param(model, "wte.weight"), router = param(model, "h.0.moe.router.weight");
  wte.zero_();
  router.zero_();
  const double normalised = 2.0 / std::sqrt(2.0 / kEmbd + 1e-5);  // u . LN(u), layer_norm's eps
  for (std::int64_t t = 0; t < wte.size(0); ++t) {
    const std::int64_t e = t % kExperts;
    wte[t][2 * e] = 1.0;
    wte[t][2 * e + 1] = -1.0;
  }
  for (std::int64_t e = 0; e < kExperts; ++e) {
    router[e][2 * e] = logit / normalised;
    router[e][2 * e + 1] = -logit / normalised;
  }
}

TEST(GptMoe, LogitsHaveShapeBatchSeqVocabAndAreFinite) {
  auto model = make_moe("n_layer: 2, top_k: 2, capacity_factor: 1.25");
  const at::Tensor logits = model->forward(at::randint(32, {3, 7}, at::kLong));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{3, 7, 32}));
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
  EXPECT_EQ(routing(*model).num_experts(), 4);
  EXPECT_EQ(routing(*model).experts_per_token(), 2);
  EXPECT_EQ(routing(*model).take_router_statistics().size(), 2u);
  EXPECT_EQ(model->sharding_units().size(), 2u);
}

TEST(GptMoe, FlopsPerTokenCountOnlyActiveExperts) {
  // 3 blocks, moe_every 2: only block 1 is MoE (E 4, k 2, expert width 24); the others dense.
  core::seed_everything(1, "cpu");
  auto model = built<Model>(
      build_components("model: {component_key: model, variant_key: gpt_moe, config: {vocab_size: 32, n_layer: 3, "
                       "n_head: 2, n_embd: 16, max_seq_len: 16, num_experts: 4, top_k: 2, expert_hidden: 24, "
                       "moe_every: 2}}\n"),
      "model");
  const std::int64_t D = 16, H = 24, V = 32, P = 16;
  const std::int64_t common = 2 * D + (D * 3 * D + 3 * D) + (D * D + D) + 2 * D;  // ln_1, attn, ln_2
  const std::int64_t dense = (D * 4 * D + 4 * D) + (4 * D * D + D);
  const std::int64_t expert = (D * H + H) + (H * D + D);
  const std::int64_t router = D * 4;
  const std::int64_t shared = V * D + 3 * common + 2 * dense + router + 2 * D;  // + ln_f
  EXPECT_EQ(model->num_parameters(), shared + 4 * expert + P * D);
  const double active = static_cast<double>(shared + 2 * expert);
  for (std::int64_t T : {1, 8, 16}) {
    EXPECT_DOUBLE_EQ(model->flops_per_token(T), 6.0 * active + 12.0 * 3 * D * static_cast<double>(T)) << "T=" << T;
  }
  const auto names = model->named_parameters();
  EXPECT_TRUE(names.contains("h.0.mlp.c_fc.weight"));
  EXPECT_FALSE(names.contains("h.0.moe.router.weight"));
  EXPECT_EQ(names["h.1.moe.experts.c_fc.weight"].sizes(), (at::IntArrayRef{4, H, D}));
  EXPECT_EQ(names["h.1.moe.experts.c_proj.bias"].sizes(), (at::IntArrayRef{4, D}));
}

TEST(GptMoe, AuxiliaryLossesAndStatisticsMatchAHandComputation) {
  auto model = make_moe("aux_loss_coef: 0.5, z_loss_coef: 0.25");
  const double a = 1.5;
  route_by_token(*model, a);
  // Experts of these tokens: 0 0 0 1 2 0 1 0 -> f = [5, 2, 1, 0] / 8; expert 3 gets none.
  model->forward(ids({0, 4, 8, 1, 2, 12, 5, 16}));

  const double f[] = {5.0 / 8, 2.0 / 8, 1.0 / 8, 0.0};
  const double own = std::exp(a) / (std::exp(a) + 3), other = 1.0 / (std::exp(a) + 3);
  double aux = 0;
  for (double fe : f) aux += fe * (fe * own + (1 - fe) * other);  // f_e * P_e
  aux *= kExperts;
  const double z = std::pow(std::log(std::exp(a) + 3), 2);
  const double entropy = -(own * std::log(own) + 3 * other * std::log(other));

  EXPECT_NEAR(model->auxiliary_loss().item<double>(), 0.5 * aux + 0.25 * z, 1e-5);
  const auto stats = routing(*model).take_router_statistics();
  ASSERT_EQ(stats.size(), 1u);
  const RouterStatistics& s = stats[0];
  EXPECT_TRUE(s.expert_assignments.equal(at::tensor({5.0f, 2.0f, 1.0f, 0.0f})));
  EXPECT_EQ(s.tokens.item<double>(), 8);
  EXPECT_EQ(s.dropped_assignments.item<double>(), 0);
  EXPECT_NEAR(s.aux_loss_sum.item<double>(), aux, 1e-5);
  EXPECT_NEAR(s.z_loss_sum.item<double>(), z, 1e-5);
  EXPECT_NEAR(s.entropy_sum.item<double>(), 8 * entropy, 1e-4);
  EXPECT_EQ(s.forwards, 1);

  // Taking resets the sums; evaluation forwards are not counted.
  model->eval();
  model->forward(ids({0, 1}));
  const auto after = routing(*model).take_router_statistics();
  EXPECT_EQ(after[0].forwards, 0);
  EXPECT_EQ(after[0].tokens.item<double>(), 0);
}

TEST(GptMoe, NoAuxiliaryLossWhenBothCoefficientsAreZero) {
  auto model = make_moe("aux_loss_coef: 0, z_loss_coef: 0");
  model->forward(ids({1, 2, 3}));
  EXPECT_FALSE(model->auxiliary_loss().defined());
}

TEST(GptMoe, CapacityDropsLaterAssignmentsInTokenOrder) {
  // 8 tokens all routed to expert 0, top-1: capacity ceil(factor * 8 * 1 / 4).
  const at::Tensor input = ids({0, 4, 8, 12, 16, 20, 24, 28});
  auto unlimited = make_moe("capacity_factor: 0", 9);
  route_by_token(*unlimited, 3.0);
  const at::Tensor reference = unlimited->forward(input);
  EXPECT_EQ(routing(*unlimited).take_router_statistics()[0].dropped_assignments.item<double>(), 0);

  for (const auto& [factor, capacity] : std::vector<std::pair<double, std::int64_t>>{{1.0, 2}, {1.25, 3}}) {
    SCOPED_TRACE("capacity_factor " + std::to_string(factor));
    auto model = make_moe("capacity_factor: " + std::to_string(factor), 9);  // same weights
    route_by_token(*model, 3.0);
    const at::Tensor logits = model->forward(input);
    const auto s = routing(*model).take_router_statistics()[0];
    EXPECT_EQ(s.expert_assignments[0].item<double>(), 8);  // counted before the drop
    EXPECT_EQ(s.dropped_assignments.item<double>(), 8 - capacity);
    // The first `capacity` tokens went through the expert; later ones kept only their residual.
    // The attention adds nothing here, so each position depends on its own token alone.
    for (std::int64_t t = 0; t < 8; ++t) {
      const double diff = (logits.select(1, t) - reference.select(1, t)).abs().max().item<double>();
      if (t < capacity) {
        EXPECT_LE(diff, 1e-6) << "position " << t;
      } else {
        EXPECT_GT(diff, 1e-4) << "position " << t;
      }
    }
  }
}

TEST(GptMoe, EveryRouterAndExpertParameterGetsAGradient) {
  auto model = make_moe("n_layer: 2, num_experts: 8, top_k: 2, capacity_factor: 1.0");
  // One token: 2 of 8 experts per layer get it, the other 6 get no rows at all.
  const at::Tensor logits = model->forward(ids({5}));
  (logits.pow(2).sum() + model->auxiliary_loss()).backward();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
  }
  const auto stats = routing(*model).take_router_statistics();
  for (std::size_t layer = 0; layer < stats.size(); ++layer) {
    const at::Tensor up_grad = param(*model, "h." + std::to_string(layer) + ".moe.experts.c_fc.weight").grad();
    for (std::int64_t e = 0; e < 8; ++e) {
      const bool used = stats[layer].expert_assignments[e].item<double>() > 0;
      EXPECT_EQ(up_grad[e].abs().sum().item<double>() > 0, used) << "layer " << layer << " expert " << e;
    }
    EXPECT_EQ(stats[layer].expert_assignments.sum().item<double>(), 2);
  }
  EXPECT_GT(param(*model, "h.1.moe.router.weight").grad().abs().sum().item<double>(), 0);
}

// Activation checkpointing on dense and MoE blocks (moe_every: 2 makes block 0 dense, block 1
// MoE) with dropout: the loss with the router's auxiliary terms and every gradient equal the
// plain run's bit for bit, and the routing statistics are counted once, not again when the
// recomputation runs.
TEST(GptMoe, ActivationCheckpointingGivesIdenticalGradientsAndCountsRoutingOnce) {
  const std::string config = "n_layer: 2, moe_every: 2, num_experts: 4, top_k: 2, dropout: 0.2, aux_loss_coef: 0.1";
  auto run = [&](const std::string& extra) {
    auto model = make_moe(config + extra);
    model->train();
    core::seed_everything(9, "cpu");
    const at::Tensor input = at::tensor(std::vector<std::int64_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, at::kLong).view({2, 6});
    const at::Tensor logits = model->forward(input);
    const at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), input.reshape({-1})) +
                            model->auxiliary_loss();
    // Block 0 (dense) recomputed whole, block 1 (MoE) its attention: two checkpoint nodes.
    EXPECT_EQ(testing::count_graph_nodes(loss, "CheckpointFunction"), extra.empty() ? 0 : 2);
    loss.backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad().clone();
    const auto stats = routing(*model).take_router_statistics();
    return std::make_tuple(loss.item<double>(), grads, stats.back().expert_assignments.sum().item<double>());
  };
  const auto [plain_loss, plain_grads, plain_assignments] = run("");
  const auto [loss, grads, assignments] = run(", activation_checkpointing: true");
  EXPECT_EQ(loss, plain_loss);
  EXPECT_EQ(assignments, plain_assignments);
  EXPECT_EQ(assignments, 12 * 2) << "every token routed to top_k experts, counted once";
  for (const auto& [name, grad] : plain_grads) {
    EXPECT_TRUE(grads.at(name).equal(grad)) << name;
  }
}

TEST(GptMoe, BadConfigsAreConfigIssues) {
  EXPECT_NE(testing::validation_error(moe_yaml("top_k: 0")), "");
  for (const auto& [extra, message] : std::vector<std::pair<std::string, std::string>>{
           {"top_k: 5", "top_k (5) must not exceed num_experts (4)"},
           {"moe_every: 2", "moe_every (2) exceeds n_layer (1)"}}) {
    try {
      build_components(moe_yaml(extra));
      ADD_FAILURE() << "expected a ConfigIssue for " << extra;
    } catch (const core::ConfigIssue& e) {
      EXPECT_NE(e.message().find(message), std::string::npos) << e.what();
    }
  }
}

// ---- with the real trainer ----

std::string token_file(const testing::TempDir& dir, bool repeated) {
  std::vector<std::uint16_t> tokens;
  std::uint32_t state = 5;
  for (int i = 0; i < 3000; ++i) {
    tokens.push_back(static_cast<std::uint16_t>(repeated ? 1 + i % 16 : 1 + (state = state * 1103515245u + 12345u) % 31));
  }
  const std::string path = dir.file("tokens.bin");
  testing::write_token_file(path, tokens);
  return path;
}

std::string run_yaml(const std::string& data, const std::string& parallel = "") {
  return "model: {component_key: model, variant_key: gpt_moe, config: {vocab_size: 32, n_layer: 2, n_head: 2,\n"
         "        n_embd: 32, max_seq_len: 16, num_experts: 4, top_k: 2, capacity_factor: 1.25,\n"
         "        aux_loss_coef: 0.01, z_loss_coef: 0.001}}\n"
         "train_data: {component_key: dataset, variant_key: tokens, config: {path: " + data + ", seq_len: 16}}\n"
         "loss: {component_key: loss, variant_key: cross_entropy}\n"
         "optimizer: {component_key: optimizer, variant_key: adamw,\n"
         "            config: {lr: 0.01, weight_decay: 0.1, model: {instance_key: model, pass_type: BY_REFERENCE}}}\n" +
         parallel;
}

std::mutex build_mutex;  // the global generator seeds each rank's build in turn

// Builds and runs `steps` trainer steps on this rank; returns the losses and the final weights.
std::vector<double> train(const std::string& yaml, std::shared_ptr<Communicator> comm, std::int64_t accum,
                          std::int64_t micro_batch, std::int64_t steps, StateDict* weights = nullptr,
                          const std::string& precision = "fp32") {
  RunContext context = testing::rank_context(comm, 42);
  context.precision = precision;
  core::BuiltComponents components;
  {
    std::lock_guard<std::mutex> lock(build_mutex);
    core::seed_everything(context.seed + 100 * static_cast<std::uint64_t>(context.rank), "cpu");
    components = build_components(yaml, context);
  }
  core::TrainerParts parts = testing::trainer_parts(components);
  core::TrainerSettings settings;
  settings.grad_accum = accum;
  settings.micro_batch_size = micro_batch;
  settings.max_steps = steps;
  settings.clip_grad_norm = 1.0;
  const auto strategy = parts.parallel;
  core::Trainer trainer(std::move(parts), settings, context);
  std::vector<double> losses;
  for (std::int64_t s = 0; s < steps; ++s) losses.push_back(trainer.step().loss);
  if (weights && strategy) *weights = strategy->full_parameters(trainer.model());  // fsdp: gathered
  if (weights && !strategy) {
    for (const auto& item : trainer.model().named_parameters()) (*weights)[item.key()] = item.value().detach().clone();
  }
  return losses;
}

// bf16 autocast over the MoE: the first steps' losses equal fp32's within 2% (the router computes
// in float32 either way), a different computation (autocast was on), and the loss falls as
// fast. Later steps memorise the repeated sequence, where losses near zero differ relatively more.
TEST(GptMoe, Bf16ComputeTracksFp32) {
  testing::TempDir dir;
  const std::string yaml = run_yaml(token_file(dir, true));
  const auto fp32 = train(yaml, core::make_local_communicator(), 1, 4, 20);
  const auto bf16 = train(yaml, core::make_local_communicator(), 1, 4, 20, nullptr, "bf16");
  ASSERT_EQ(bf16.size(), fp32.size());
  EXPECT_NE(bf16.front(), fp32.front());
  for (std::size_t s = 0; s < 5; ++s) EXPECT_NEAR(bf16[s], fp32[s], 0.02 * fp32[s]) << "step " << s + 1;
  EXPECT_LT(bf16.back(), 0.3 * bf16.front());
  EXPECT_LT(fp32.back(), 0.3 * fp32.front());
}

TEST(GptMoe, TrainsOnARepeatedSequence) {
  testing::TempDir dir;
  const auto losses = train(run_yaml(token_file(dir, true)), core::make_local_communicator(), 1, 4, 30);
  EXPECT_GT(losses.front(), 3.0);  // about log(32) at the start
  EXPECT_LT(losses.back(), 0.3 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
}


// One MoE layer under expert parallelism on 2 Gloo ranks that route different numbers of tokens
// (top-2, a capacity that drops some, so the parts exchanged are uneven and some empty): each
// rank's output is the whole layer's on its tokens, its experts get the gradients the whole layer
// gets from both ranks' tokens, and its router gets its own tokens' gradient.
TEST(GptMoe, AnExpertParallelLayerComputesWhatTheWholeLayerDoes) {
  gpt_family::GptMoeConfig s;
  s.n_embd = 16;
  s.num_experts = 4;
  s.top_k = 2;
  s.expert_hidden = 24;
  s.capacity_factor = 1.0;
  core::seed_everything(5, "cpu");
  // gpt_moe's MoE layer: the kit's GELU experts with the config's routing.
  nn::GeluExperts whole(s.routing(), {}, s.n_embd, s.expert_width(), s.bias, s.dropout);
  StateDict init;
  {
    c10::NoGradGuard no_grad;
    for (auto& item : whole.named_parameters()) {
      item.value().copy_(at::randn(item.value().sizes()) * 0.3);
      init[item.key()] = item.value().detach().clone();
    }
  }
  const std::vector<at::Tensor> inputs = {at::randn({2, 7, 16}), at::randn({1, 5, 16})};
  std::vector<at::Tensor> output_grads, expected_outputs;
  std::vector<StateDict> expected_grads(2);
  for (std::size_t r = 0; r < 2; ++r) {
    output_grads.push_back(at::randn(inputs[r].sizes()));
    whole.zero_grad();
    const at::Tensor out = whole.forward(inputs[r]);
    out.backward(output_grads[r]);
    expected_outputs.push_back(out.detach());
    for (auto& item : whole.named_parameters()) expected_grads[r][item.key()] = item.value().grad().clone();
  }
  const auto stats = whole.take_statistics();
  ASSERT_GT(stats.dropped_assignments.item<double>(), 0) << "the capacity drops some assignments";

  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> group) {
    const auto r = static_cast<std::size_t>(rank);
    nn::GeluExperts part(s.routing(), ExpertParallel(group), s.n_embd, s.expert_width(), s.bias, s.dropout);
    auto mine = [&](const std::string& name, const at::Tensor& whole_tensor) {
      return name.rfind("experts.", 0) == 0 ? whole_tensor.narrow(0, 2 * rank, 2) : whole_tensor;
    };
    {
      c10::NoGradGuard no_grad;
      for (auto& item : part.named_parameters()) item.value().copy_(mine(item.key(), init.at(item.key())));
    }
    const at::Tensor out = part.forward(inputs[r]);
    out.backward(output_grads[r]);
    if (!out.allclose(expected_outputs[r], 1e-5, 1e-6)) {
      throw Error("output differs by " + std::to_string((out - expected_outputs[r]).abs().max().item<double>()));
    }
    for (auto& item : part.named_parameters()) {
      const std::string& name = item.key();
      // Experts: both ranks' tokens; the router: this rank's own.
      const at::Tensor expected = name.rfind("experts.", 0) == 0
                                      ? mine(name, expected_grads[0].at(name) + expected_grads[1].at(name))
                                      : expected_grads[r].at(name);
      if (!item.value().grad().allclose(expected, 1e-4, 1e-6)) {
        throw Error(name + " gradient differs by " + std::to_string((item.value().grad() - expected).abs().max().item<double>()));
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// One sample per micro-batch, so both runs route the same groups of tokens (capacity and the
// balance loss depend on what shares a forward pass). ddp and fsdp: fsdp frees a block's
// parameters after its forward, and the auxiliary loss reaches the router outside the block's output.
void expect_two_ranks_match_one(const std::string& strategy) {
  SCOPED_TRACE("parallel/" + strategy);
  testing::TempDir dir;
  const std::string data = token_file(dir, false);
  StateDict reference_weights;
  const auto reference = train(run_yaml(data), core::make_local_communicator(), 2, 1, 3, &reference_weights);

  std::vector<std::vector<double>> losses(2);
  std::vector<StateDict> weights(2);
  const std::vector<std::string> errors = testing::run_on_gloo_ranks(2, [&](std::int64_t r, std::shared_ptr<Communicator> comm) {
    const auto i = static_cast<std::size_t>(r);
    losses[i] = train(run_yaml(data, "parallel: {component_key: parallel, variant_key: " + strategy + "}\n"),
                      std::move(comm), 1, 1, 3, &weights[i]);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(errors[r], "");
    ASSERT_EQ(losses[r].size(), reference.size());
    for (std::size_t s = 0; s < reference.size(); ++s) {
      EXPECT_NEAR(losses[r][s], reference[s], 1e-5 * reference[s]) << "step " << s + 1;
    }
    for (const auto& [name, w] : reference_weights) {
      // AdamW turns the near-zero gradients of some biases into full-size steps, so those amplify
      // summation-order noise; 1e-4 is still far below one step's change (lr 0.01).
      EXPECT_TRUE(weights[r].at(name).allclose(w, 1e-4, 1e-4))
          << name << " differs by " << (weights[r].at(name) - w).abs().max().item<double>();
    }
  }
}

TEST(GptMoe, TwoGlooRanksMatchOneRankWithTwiceTheMicroBatchesUnderDdp) { expect_two_ranks_match_one("ddp"); }
TEST(GptMoe, TwoGlooRanksMatchOneRankWithTwiceTheMicroBatchesUnderFsdp) { expect_two_ranks_match_one("fsdp"); }

}  // namespace gpt_moe_test
}  // namespace tessera

namespace tessera {
namespace gpt_moe_test {

// gpt_moe starts from its own export (weights and the record of the architecture it built): the
// same logits; a YAML whose experts differ from the record's is told so, naming the field.
TEST(GptMoe, StartsFromItsOwnExportAndRefusesOtherExperts) {
  testing::TempDir dir;
  auto model = make_moe("n_layer: 2, moe_every: 2", 7);
  StateDict state;
  for (const auto& item : model->named_parameters()) state[item.key()] = item.value().detach();
  write_safetensors(dir.file("model.safetensors"), state);
  std::ofstream(dir.file("config.json")) << core::export_config_json(
      R"({"component_key": "model", "variant_key": "gpt_moe", "config": {"init_from": "/elsewhere"}})",
      model->architecture_json());
  const std::string from = "init_from: " + dir.path().string();
  auto loaded = built<Model>(build_components(
                                 "model: {component_key: model, variant_key: gpt_moe, config: {" + from + "}}\n"),
                             "model");
  model->eval();
  loaded->eval();
  const at::Tensor input = ids({1, 2, 3, 4, 5, 6});
  EXPECT_TRUE(at::allclose(loaded->forward(input), model->forward(input), 1e-6, 1e-6));
  EXPECT_EQ(routing(*loaded).num_experts(), kExperts);
  try {
    build_components(moe_yaml("n_layer: 2, moe_every: 2, num_experts: 8, " + from));
    ADD_FAILURE() << "8 experts over an export of 4 were accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("components.model.config.num_experts: the YAML says num_experts: 8 but"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("says num_experts: 4"), std::string::npos) << e.what();
  }
}

}  // namespace gpt_moe_test
}  // namespace tessera
