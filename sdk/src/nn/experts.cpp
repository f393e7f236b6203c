#include "tessera/nn/experts.hpp"

#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <utility>

#include <c10/core/GradMode.h>

#include "tessera/nn/deferred_init.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::nn {

void check_moe_fields(const MoeFields& c) {
  if (c.mixture_of_experts() && c.top_k > c.num_experts) {
    throw ConfigError("top_k (" + std::to_string(c.top_k) + ") must not exceed num_experts (" +
                          std::to_string(c.num_experts) + ")",
                      "top_k");
  }
}

void check_expert_parallel(const MoeFields& c, const ParallelDims& dims, const std::string& dense) {
  if (dims.ep == 1) return;
  if (!c.mixture_of_experts()) {
    throw ConfigError("parallelism.ep is " + std::to_string(dims.ep) + " but " + dense, "num_experts");
  }
  if (c.num_experts % dims.ep != 0) {
    throw ConfigError("num_experts (" + std::to_string(c.num_experts) + ") must be divisible by parallelism.ep (" +
                          std::to_string(dims.ep) + "): each expert-parallel rank holds num_experts / ep",
                      "num_experts");
  }
}

bool MoeBlockPattern::routes(std::int64_t block) const {
  return block >= first_dense && (block + 1) % every == 0 && std::find(dense.begin(), dense.end(), block) == dense.end();
}

std::vector<std::int64_t> MoeBlockPattern::routed_blocks(std::int64_t blocks) const {
  std::vector<std::int64_t> out;
  for (std::int64_t b = 0; b < blocks; ++b) {
    if (routes(b)) out.push_back(b);
  }
  return out;
}

ExpertLinear::ExpertLinear(std::int64_t experts, std::int64_t in, std::int64_t out, bool with_bias) {
  // On the meta device while the host defers initialisation (the model initialises them).
  weight = register_parameter("weight", new_parameter({experts, out, in}));
  if (with_bias) bias = register_parameter("bias", parameter({experts, out}, 0.0));
}

std::vector<at::Tensor> ExpertLinear::biases() const {
  return bias.defined() ? bias.unbind(0) : std::vector<at::Tensor>(static_cast<std::size_t>(weight.size(0)));
}

MoeLayer::MoeLayer(const ExpertRouting& routing, ExpertParallel ep, std::int64_t hidden, const std::string& router_name)
    : router_(routing, std::move(ep)) {
  router_linear = register_module(router_name, std::make_shared<Linear>(hidden, routing.num_experts, false, false));
  if (routing.correction_bias) {
    correction_bias_ = router_linear->register_buffer("e_score_correction_bias",
                                                      at::zeros({routing.num_experts}, at::kFloat));
  }
}

void MoeLayer::balance_by_bias(double speed, Communicator* group) {
  at::Tensor loads = router_.take_loads();
  if (!correction_bias_.defined() || !loads.defined()) return;
  c10::NoGradGuard no_grad;
  if (group != nullptr && group->world_size() > 1) group->all_reduce(loads);
  correction_bias_.add_(at::sign(loads.mean() - loads) * speed);
}

RouterStatistics MoeLayer::take_statistics() {
  return router_.take_statistics(router_linear->weight.options().dtype(at::kFloat));
}

GeluExperts::GeluExperts(const ExpertRouting& routing, ExpertParallel ep, std::int64_t hidden,
                         std::int64_t expert_hidden, bool bias, double dropout)
    : MoeLayer(routing, std::move(ep), hidden, "router"), dropout_(dropout) {
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
  const std::int64_t mine = router_.local_experts();
  up = experts->register_module("c_fc", std::make_shared<ExpertLinear>(mine, hidden, expert_hidden, bias));
  down = experts->register_module("c_proj", std::make_shared<ExpertLinear>(mine, expert_hidden, hidden, bias));
}

at::Tensor GeluExperts::forward(const at::Tensor& x) {
  const auto w_up = up->weights(), b_up = up->biases(), w_down = down->weights(), b_down = down->biases();
  const at::Tensor combined = router_.route(
      x.reshape({-1, x.size(-1)}), router_linear->weight,
      [&](std::int64_t e, const at::Tensor& rows) {
        const auto i = static_cast<std::size_t>(e);
        return at::linear(at::gelu(at::linear(rows, w_up[i], b_up[i])), w_down[i], b_down[i]);
      },
      is_training(), correction_bias_);
  return at::dropout(combined.view(x.sizes()), dropout_, is_training());
}

void GeluExperts::plan(TensorParallelPlan& plan, const std::string& prefix, bool bias) {
  for (const char* stack : {"c_fc", "c_proj"}) {
    plan[prefix + "experts." + stack + ".weight"] = TensorShard::expert_stack();
    if (bias) plan[prefix + "experts." + stack + ".bias"] = TensorShard::expert_stack();
  }
}

SwiGluExperts::SwiGluExperts(const ExpertRouting& routing, ExpertParallel ep, std::int64_t hidden,
                             std::int64_t expert_hidden, const SwiGluExpertNames& names, std::int64_t shared_hidden,
                             TensorParallel tp)
    : MoeLayer(routing, std::move(ep), hidden, names.router) {
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
  const std::int64_t mine = router_.local_experts();
  gate = experts->register_module(names.gate, std::make_shared<ExpertLinear>(mine, hidden, expert_hidden, false));
  down = experts->register_module(names.down, std::make_shared<ExpertLinear>(mine, expert_hidden, hidden, false));
  up = experts->register_module(names.up, std::make_shared<ExpertLinear>(mine, hidden, expert_hidden, false));
  if (shared_hidden > 0) {
    shared = register_module(names.shared, std::make_shared<SwiGlu>(hidden, shared_hidden, false, std::move(tp)));
  }
}

at::Tensor SwiGluExperts::forward(const at::Tensor& x) {
  const auto gates = gate->weights(), downs = down->weights(), ups = up->weights();
  const at::Tensor y = router_.route(
      x.reshape({-1, x.size(-1)}), router_linear->weight,
      [&](std::int64_t e, const at::Tensor& rows) {
        const auto i = static_cast<std::size_t>(e);
        return at::linear(at::silu(at::linear(rows, gates[i])) * at::linear(rows, ups[i]), downs[i]);
      },
      is_training(), correction_bias_);
  return shared ? y.view(x.sizes()) + shared->forward(x) : y.view(x.sizes());
}

void SwiGluExperts::plan(TensorParallelPlan& plan, const std::string& prefix, const SwiGluExpertNames& names,
                         bool shared) {
  for (const std::string& stack : {names.gate, names.up, names.down}) {
    plan[prefix + "experts." + stack + ".weight"] = TensorShard::expert_stack();
  }
  if (shared) SwiGlu::plan(plan, prefix + names.shared + ".");
}

}  // namespace tessera::nn
