// The routing of a mixture-of-experts layer, for any model plugin: a router's scores send each
// token to its top-k experts, each expert runs on the tokens it got (at most its capacity), and
// the outputs come back summed with the gate weights. Under expert parallelism (ExpertParallel)
// this rank holds num_experts / ep of the experts and the tokens travel to the rank holding
// theirs and back by all-to-all; routing, capacity and the losses are still those of this rank's
// tokens, so a run gives what it gives without expert parallelism.
//
// The model owns the parameters (router weight, stacked expert tensors: their names are its
// checkpoint's) and says what an expert computes; the router owns the dispatch, the
// Switch/GShard load-balancing and router z-losses, and the statistics MoeRouting reports.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "tessera/export.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/parallel/expert_parallel.hpp"

namespace tessera {

// How a router turns its logits into scores: a softmax over the experts (Mixtral, Qwen-MoE) or
// each expert's own sigmoid (DeepSeek-V3).
enum class RouterScore { softmax, sigmoid };

struct ExpertRouting {
  std::int64_t num_experts = 8;
  std::int64_t top_k = 2;
  double capacity_factor = 0.0;  // ceil(factor x tokens x k / E) assignments per expert; 0: no limit
  bool renormalize_topk = true;  // divide the k gate scores by their sum
  RouterScore score = RouterScore::softmax;
  // Grouped (device-limited) routing, DeepSeek-V3's n_group / topk_group: the experts in `groups`
  // equal groups, each group rated by the sum of its two best scores, a token's top_k chosen
  // within its best `groups_kept` groups. 1 and 1: no groups.
  std::int64_t groups = 1;
  std::int64_t groups_kept = 1;
  double routed_scaling = 1.0;   // routed_scaling_factor: the gates multiplied by it
  bool correction_bias = false;  // e_score_correction_bias: added to the scores to choose, not to weigh
};

class TESSERA_API ExpertRouter {
 public:
  // Expert `local` of this rank (0 .. num_experts / ep) on `rows` [n, C] (n may be 0): [n, C].
  using Expert = std::function<at::Tensor(std::int64_t local, const at::Tensor& rows)>;

  explicit ExpertRouter(ExpertRouting routing, ExpertParallel ep = {});

  // `tokens` [N, C]; `router_weight` [E, C]; `correction_bias` [E] (float32, no gradient) when
  // the routing has one. The logits and scores are computed in float32 whatever the compute dtype
  // (nearly equal scores must not be decided by bf16 rounding). A token's experts are its top_k
  // by score plus correction bias (within its best groups), its gates their scores (renormalised,
  // scaled); the assignments of each expert are kept in token order up to its capacity. Every
  // expert of this
  // rank runs, on zero rows when it got none, so each of its parameters gets a gradient in every
  // backward (ddp's buckets and fsdp's units expect that). Returns [N, C] in tokens' dtype.
  // `training`: the statistics are summed (training forwards only).
  at::Tensor route(const at::Tensor& tokens, const at::Tensor& router_weight, const Expert& expert, bool training,
                   const at::Tensor& correction_bias = {});

  // The unweighted balance loss E x sum_e f_e P_e (1 when uniform; f_e the share of assignments
  // before drops, P_e the mean router probability: the softmax, or the sigmoid scores divided by
  // their sum) and z-loss mean(logsumexp(logits)^2) of the last route, with their graphs.
  const at::Tensor& last_aux_loss() const { return aux_loss_; }
  const at::Tensor& last_z_loss() const { return z_loss_; }

  // The sums since the last take, and a fresh start (zeros on `options` when nothing was routed).
  RouterStatistics take_statistics(const at::TensorOptions& options);
  // Each expert's assignments [E] (float32, before capacity drops) in the training forwards since
  // the last take, apart from the statistics (a monitor's takes do not reset them); undefined
  // when nothing was routed.
  at::Tensor take_loads();

  const ExpertRouting& routing() const { return routing_; }
  const ExpertParallel& expert_parallel() const { return ep_; }
  std::int64_t local_experts() const { return ep_.local(routing_.num_experts); }
  std::int64_t capacity(std::int64_t tokens) const;

 private:
  // Each token's top_k experts [N, k] by `scores` [N, E] plus the correction bias, within its
  // best groups.
  at::Tensor choose(const at::Tensor& scores, const at::Tensor& correction_bias) const;
  // The experts' outputs for `rows` (kept[e] rows for expert e, in expert order), by way of the
  // ranks holding them.
  at::Tensor run_experts(const at::Tensor& rows, const std::vector<std::int64_t>& kept, const Expert& expert) const;

  ExpertRouting routing_;
  ExpertParallel ep_;
  at::Tensor aux_loss_, z_loss_;
  RouterStatistics sums_;
  at::Tensor loads_;
};

}  // namespace tessera
