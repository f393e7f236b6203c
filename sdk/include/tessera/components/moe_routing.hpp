// What a mixture-of-experts model tells monitors about its routers. A model with MoE layers
// implements MoeRouting beside Model; a callback finds it with dynamic_cast and takes the
// statistics each step (callback/moe_monitor sums them over ranks and logs them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

// One MoE layer's routing, summed over the forward passes since the last take. Tensors live on
// the model's device so a monitor can reduce them across ranks in one collective.
struct RouterStatistics {
  std::int64_t layer = -1;        // the block this MoE layer sits in (names its metrics); -1: its position
  at::Tensor expert_assignments;  // [experts] float: token->expert choices (k per token), before capacity drops
  at::Tensor dropped_assignments; // [] float: choices dropped because an expert was full
  at::Tensor tokens;              // [] float: tokens routed
  at::Tensor entropy_sum;         // [] float: sum over tokens of the router distribution's entropy (nats)
  at::Tensor aux_loss_sum;        // [] float: sum over forwards of the unweighted load-balancing loss
  at::Tensor z_loss_sum;          // [] float: sum over forwards of the unweighted router z-loss
  std::int64_t forwards = 0;      // forward passes summed
};

class TESSERA_API MoeRouting {
 public:
  virtual ~MoeRouting();
  virtual std::int64_t num_experts() const = 0;
  virtual std::int64_t experts_per_token() const = 0;  // top-k
  // One entry per MoE layer, in depth order; resets the sums. Training forwards only.
  virtual std::vector<RouterStatistics> take_router_statistics() = 0;
};

}  // namespace tessera
