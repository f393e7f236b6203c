// The mixture-of-experts feed-forward layer of model/gpt_moe (header only, compiled into that
// plugin alone): a router and GELU-MLP experts stacked into one tensor per weight; the routing,
// capacity, losses, statistics and expert parallelism are the SDK's (tessera::ExpertRouter).
#pragma once

#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "../expert_linear.hpp"
#include "../gpt/transformer_parts.hpp"
#include "gpt_moe_config.hpp"
#include "tessera/expert_router.hpp"

namespace tessera::gpt_moe {

using gpt_parts::ExpertLinear;
using gpt_parts::linear_layer;

inline ExpertRouting routing_of(const GptMoeConfig& s) {
  return {s.num_experts, s.top_k, s.capacity_factor, s.renormalize_topk};
}

// Each token to its top-k experts, each a GELU MLP; their outputs summed with the gate weights.
// Parameters: router.weight [E, C], experts.c_fc.{weight [E, H, C], bias}, experts.c_proj.{weight
// [E, C, H], bias}. Under expert parallelism (`ep`) this rank holds experts
// [first, first + E / ep) of the stacked tensors.
class MoeFeedForward : public torch::nn::Module {
 public:
  MoeFeedForward(const GptMoeConfig& s, tessera::ExpertParallel ep = {}) : s_(s), router_(routing_of(s), std::move(ep)) {
    // Not adaptable: the routing reads its weight directly.
    router = register_module("router", std::make_shared<gpt_parts::Affine>(s.n_embd, s.num_experts, false, false));
    auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
    const std::int64_t mine = router_.local_experts();
    up = experts->register_module("c_fc", std::make_shared<ExpertLinear>(mine, s.n_embd, s.expert_width(), s.bias));
    down = experts->register_module("c_proj", std::make_shared<ExpertLinear>(mine, s.expert_width(), s.n_embd, s.bias));
  }

  at::Tensor forward(const at::Tensor& x) {
    const auto w_up = up->weights(), b_up = up->biases(), w_down = down->weights(), b_down = down->biases();
    const at::Tensor combined = router_.route(
        x.reshape({-1, x.size(-1)}), router->weight,
        [&](std::int64_t e, const at::Tensor& rows) {
          const auto i = static_cast<std::size_t>(e);
          return at::linear(at::gelu(at::linear(rows, w_up[i], b_up[i])), w_down[i], b_down[i]);
        },
        is_training());
    return at::dropout(combined.view(x.sizes()), s_.dropout, is_training());
  }

  // The unweighted balance and z-losses of the last forward, with their graphs.
  const at::Tensor& last_aux_loss() const { return router_.last_aux_loss(); }
  const at::Tensor& last_z_loss() const { return router_.last_z_loss(); }
  tessera::RouterStatistics take_statistics() {
    return router_.take_statistics(router->weight.options().dtype(at::kFloat));
  }

  std::shared_ptr<gpt_parts::Affine> router;
  std::shared_ptr<ExpertLinear> up, down;

 private:
  GptMoeConfig s_;
  tessera::ExpertRouter router_;
};

}  // namespace tessera::gpt_moe
