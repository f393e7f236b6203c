// The transformer kit's router options against their definitions, token by token in plain C++:
// DeepSeek-V3's routing (sigmoid scores, the correction bias choosing but not weighing, the best
// groups by their two best scores, renormalised and scaled gates), softmax gates left
// unnormalised (Qwen3-MoE's norm_topk_prob false), shared experts added to the routed output, the
// correction bias as a checkpointed buffer, and which blocks of a decoder route.
#include <gtest/gtest.h>

#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/nn/expert_router.hpp"
#include "tessera/nn/experts.hpp"

namespace tessera {
namespace kit_router_options_test {

constexpr std::int64_t kTokens = 12, kWidth = 6, kExperts = 8;

// Expert e multiplies its rows by e + 1: the combined output of a token is its input times
// sum over its experts of gate x (e + 1).
at::Tensor scaling_expert(std::int64_t e, const at::Tensor& rows) { return rows * static_cast<double>(e + 1); }

// The gates of one token as the definition gives them, from its logits.
std::vector<double> reference_gates(const std::vector<double>& logits, const std::vector<double>& bias,
                                    const ExpertRouting& r) {
  const std::size_t experts = logits.size();
  std::vector<double> score(experts);
  if (r.score == RouterScore::sigmoid) {
    for (std::size_t e = 0; e < experts; ++e) score[e] = 1 / (1 + std::exp(-logits[e]));
  } else {
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (std::size_t e = 0; e < experts; ++e) sum += score[e] = std::exp(logits[e] - top);
    for (double& s : score) s /= sum;
  }
  std::vector<double> choice(experts);
  for (std::size_t e = 0; e < experts; ++e) choice[e] = score[e] + (bias.empty() ? 0 : bias[e]);
  // Groups rated by the sum of their two best choice scores; the others' experts are not chosen.
  const std::size_t per_group = experts / static_cast<std::size_t>(r.groups);
  std::vector<std::pair<double, std::size_t>> ratings;
  for (std::size_t g = 0; g < static_cast<std::size_t>(r.groups); ++g) {
    std::vector<double> members(choice.begin() + static_cast<std::ptrdiff_t>(g * per_group),
                                choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * per_group));
    std::sort(members.rbegin(), members.rend());
    ratings.push_back({members[0] + members[1], g});
  }
  std::sort(ratings.rbegin(), ratings.rend());
  std::vector<bool> kept(static_cast<std::size_t>(r.groups));
  for (std::size_t i = 0; i < static_cast<std::size_t>(r.groups_kept); ++i) kept[ratings[i].second] = true;
  for (std::size_t e = 0; e < experts; ++e) {
    if (!kept[e / per_group]) choice[e] = -std::numeric_limits<double>::infinity();
  }
  std::vector<std::size_t> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return choice[a] > choice[b]; });
  std::vector<double> gates(experts);
  double sum = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(r.top_k); ++i) sum += gates[order[i]] = score[order[i]];
  for (double& g : gates) g = (r.renormalize_topk ? g / sum : g) * r.routed_scaling;
  return gates;
}

// The router's output for tokens x, router weight w and bias against the per-token definition.
void expect_routes_as_defined(const ExpertRouting& routing, const at::Tensor& bias) {
  const at::Tensor x = at::randn({kTokens, kWidth});
  const at::Tensor w = at::randn({kExperts, kWidth});
  ExpertRouter router(routing);
  c10::NoGradGuard no_grad;
  const at::Tensor got = router.route(x, w, scaling_expert, /*training=*/false, bias);
  const at::Tensor logits = at::linear(x, w).to(at::kDouble).contiguous();
  std::vector<double> b;
  if (bias.defined()) b.assign(bias.data_ptr<float>(), bias.data_ptr<float>() + kExperts);
  for (std::int64_t t = 0; t < kTokens; ++t) {
    const double* row = logits[t].data_ptr<double>();
    const std::vector<double> gates = reference_gates(std::vector<double>(row, row + kExperts), b, routing);
    double factor = 0;
    for (std::size_t e = 0; e < gates.size(); ++e) factor += gates[e] * static_cast<double>(e + 1);
    const at::Tensor want = x[t] * factor;
    EXPECT_TRUE(at::allclose(got[t], want, 1e-5, 1e-5)) << "token " << t << ": " << got[t] << " vs " << want;
  }
}

TEST(KitRouterOptions, DeepSeekV3RoutingIsItsDefinition) {
  ExpertRouting routing;
  routing.num_experts = kExperts;
  routing.top_k = 4;  // every expert of the 2 kept groups of 2
  routing.score = RouterScore::sigmoid;
  routing.groups = 4;
  routing.groups_kept = 2;
  routing.routed_scaling = 2.5;
  routing.correction_bias = true;
  // A bias large enough to move choices: expert 0's group is chosen whatever its scores; and
  // negative enough elsewhere that an expert of a kept group may score below 0 (and must still
  // win over the experts of groups left out).
  at::Tensor bias = at::randn({kExperts}) * 0.3;
  bias[0] = 3.0;
  bias[1] = -2.0;
  expect_routes_as_defined(routing, bias);
}

TEST(KitRouterOptions, SoftmaxGatesUnnormalisedAreTheirScores) {
  ExpertRouting routing;
  routing.num_experts = kExperts;
  routing.top_k = 2;
  routing.renormalize_topk = false;
  expect_routes_as_defined(routing, {});
}

TEST(KitRouterOptions, RoutingOptionsAreCheckedAndTheBiasMustBeGivenWhenDeclared) {
  ExpertRouting grouped;
  grouped.num_experts = kExperts;
  grouped.groups = 3;  // 8 experts do not split in 3 groups
  EXPECT_THROW(ExpertRouter{grouped}, Error);
  grouped.groups = 4;
  grouped.groups_kept = 1;
  grouped.top_k = 3;  // one kept group of 2 experts cannot give 3
  EXPECT_THROW(ExpertRouter{grouped}, Error);
  ExpertRouting biased;
  biased.num_experts = kExperts;
  biased.correction_bias = true;
  ExpertRouter router(biased);
  EXPECT_THROW(router.route(at::randn({2, kWidth}), at::randn({kExperts, kWidth}), scaling_expert, false), Error);
}

// DeepSeek-V3's MoE layer: shared experts (a SwiGLU MLP every token passes through) added to the
// routed experts' output; the correction bias is a buffer under the router's name, no parameter.
TEST(KitRouterOptions, SharedExpertsAddADenseSwiGluAndTheBiasIsABuffer) {
  ExpertRouting routing;
  routing.num_experts = 4;
  routing.top_k = 2;
  routing.score = RouterScore::sigmoid;
  routing.correction_bias = true;
  const nn::SwiGluExpertNames names{"gate", "gate_proj", "up_proj", "down_proj", "shared_experts"};
  nn::SwiGluExperts with_shared(routing, {}, kWidth, 5, names, /*shared_hidden=*/10);
  nn::SwiGluExperts routed_only(routing, {}, kWidth, 5, names);
  StateDict w;
  {
    c10::NoGradGuard no_grad;
    for (auto& item : with_shared.named_parameters()) {
      item.value().copy_(at::randn(item.value().sizes()) * 0.5);
      w[item.key()] = item.value();
    }
    for (auto& item : routed_only.named_parameters()) item.value().copy_(w.at(item.key()));
    const at::Tensor bias = at::randn({4});
    with_shared.correction_bias().copy_(bias);
    routed_only.correction_bias().copy_(bias);
  }
  for (const char* name : {"shared_experts.gate_proj.weight", "shared_experts.up_proj.weight",
                           "shared_experts.down_proj.weight", "experts.gate_proj.weight"}) {
    EXPECT_TRUE(w.count(name)) << name;
  }
  const auto buffers = with_shared.named_buffers();
  ASSERT_NE(buffers.find("gate.e_score_correction_bias"), nullptr);
  EXPECT_FALSE(w.count("gate.e_score_correction_bias"));
  TensorParallelPlan plan;
  nn::SwiGluExperts::plan(plan, "mlp.", names, /*shared=*/true);
  EXPECT_EQ(plan.at("mlp.shared_experts.down_proj.weight"), TensorShard::rows());
  EXPECT_EQ(plan.at("mlp.experts.up_proj.weight"), TensorShard::expert_stack());

  const at::Tensor x = at::randn({2, 3, kWidth});
  c10::NoGradGuard no_grad;
  const at::Tensor shared = at::linear(at::silu(at::linear(x, w.at("shared_experts.gate_proj.weight"))) *
                                           at::linear(x, w.at("shared_experts.up_proj.weight")),
                                       w.at("shared_experts.down_proj.weight"));
  const at::Tensor got = with_shared.forward(x), routed = routed_only.forward(x);
  EXPECT_TRUE(at::allclose(got, routed + shared, 1e-5, 1e-6)) << (got - routed - shared).abs().max().item<double>();
}

// Auxiliary-loss-free balancing against its rule: after training forwards the correction bias
// moves by speed * sign(mean load - load) per expert (the loads: each expert's assignments since
// the last update); an update with nothing routed since, or a forward outside training, moves
// nothing.
TEST(KitRouterOptions, BiasUpdateFollowsTheLoadsSign) {
  ExpertRouting routing;
  routing.num_experts = 4;
  routing.top_k = 1;
  routing.score = RouterScore::sigmoid;
  routing.correction_bias = true;
  nn::SwiGluExperts layer(routing, {}, kWidth, 5);
  {
    c10::NoGradGuard no_grad;
    for (auto& item : layer.named_parameters()) item.value().copy_(at::randn(item.value().sizes()));
  }
  const at::Tensor x = at::randn({3, 8, kWidth});
  layer.train();
  layer.forward(x);
  layer.forward(x);
  // The loads those two forwards gave, from the router's own choice.
  at::Tensor loads = at::zeros({4});
  {
    c10::NoGradGuard no_grad;
    const at::Tensor scores = at::sigmoid(at::linear(x.reshape({-1, kWidth}), layer.router_linear->weight));
    const at::Tensor chosen = std::get<1>(at::topk(scores + layer.correction_bias(), 1, -1)).reshape({-1});
    for (std::int64_t i = 0; i < chosen.size(0); ++i) loads[chosen[i].item<std::int64_t>()] += 2;
  }
  const at::Tensor before = layer.correction_bias().clone();
  layer.balance_by_bias(0.01, nullptr);
  const at::Tensor expected = before + 0.01 * at::sign(loads.mean() - loads);
  EXPECT_TRUE(at::allclose(layer.correction_bias(), expected)) << layer.correction_bias() << " vs " << expected;
  EXPECT_FALSE(at::equal(layer.correction_bias(), before)) << "a skewed routing moves the bias";
  const at::Tensor after = layer.correction_bias().clone();
  layer.balance_by_bias(0.01, nullptr);  // nothing routed since
  layer.eval();
  layer.forward(x);
  layer.balance_by_bias(0.01, nullptr);  // evaluation forwards do not count
  EXPECT_TRUE(at::equal(layer.correction_bias(), after));
}

TEST(KitRouterOptions, BlockPatternsSayWhichBlocksRoute) {
  // DeepSeek-V3: first_k_dense_replace 3 of 6 blocks.
  EXPECT_EQ((nn::MoeBlockPattern{3, 1, {}}.routed_blocks(6)), (std::vector<std::int64_t>{3, 4, 5}));
  // Qwen-MoE: decoder_sparse_step 2, mlp_only_layers [3].
  EXPECT_EQ((nn::MoeBlockPattern{0, 2, {3}}.routed_blocks(6)), (std::vector<std::int64_t>{1, 5}));
  // Mixtral: every block.
  EXPECT_EQ((nn::MoeBlockPattern{}.routed_blocks(3)), (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_FALSE((nn::MoeBlockPattern{0, 1, {0}}.routes(0)));
}

}  // namespace kit_router_options_test
}  // namespace tessera
