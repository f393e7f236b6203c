#include "tessera/nn/expert_router.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/div.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/log.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/run/precision.hpp"

namespace tessera {

ExpertRouter::ExpertRouter(ExpertRouting routing, ExpertParallel ep) : routing_(routing), ep_(std::move(ep)) {
  if (routing_.num_experts < 1 || routing_.top_k < 1 || routing_.top_k > routing_.num_experts) {
    throw Error("ExpertRouter: top_k " + std::to_string(routing_.top_k) + " of " + std::to_string(routing_.num_experts) +
                " experts");
  }
  // Groups are rated by their two best experts: at least two in each.
  const bool grouped = routing_.groups != 1 || routing_.groups_kept != 1;
  if (grouped && (routing_.groups < 1 || routing_.num_experts % routing_.groups != 0 ||
                  routing_.num_experts / routing_.groups < 2 || routing_.groups_kept < 1 ||
                  routing_.groups_kept > routing_.groups ||
                  routing_.top_k > routing_.groups_kept * (routing_.num_experts / routing_.groups))) {
    throw Error("ExpertRouter: " + std::to_string(routing_.num_experts) + " experts in " +
                std::to_string(routing_.groups) + " groups of at least 2, " + std::to_string(routing_.groups_kept) +
                " kept, must hold top_k " + std::to_string(routing_.top_k));
  }
  if (routing_.num_experts % ep_.size() != 0) {
    throw Error("ExpertRouter: " + std::to_string(routing_.num_experts) + " experts do not split over " +
                std::to_string(ep_.size()) + " expert-parallel ranks");
  }
}

std::int64_t ExpertRouter::capacity(std::int64_t tokens) const {
  if (routing_.capacity_factor <= 0) return tokens * routing_.top_k;
  return static_cast<std::int64_t>(std::ceil(routing_.capacity_factor * static_cast<double>(tokens * routing_.top_k) /
                                             static_cast<double>(routing_.num_experts)));
}

at::Tensor ExpertRouter::choose(const at::Tensor& scores, const at::Tensor& correction_bias) const {
  c10::NoGradGuard no_grad;  // a choice: no gradient flows through it
  at::Tensor choice = correction_bias.defined() ? scores + correction_bias.to(at::kFloat) : scores;
  if (routing_.groups > 1) {
    const std::int64_t n = scores.size(0), groups = routing_.groups, per_group = routing_.num_experts / groups;
    const at::Tensor group_scores = std::get<0>(at::topk(choice.view({n, groups, per_group}), 2, -1)).sum(-1);
    const at::Tensor kept_groups = std::get<1>(at::topk(group_scores, routing_.groups_kept, -1));
    const at::Tensor kept = at::zeros({n, groups}, scores.options().dtype(at::kBool))
                                .scatter_(1, kept_groups, true)
                                .unsqueeze(-1)
                                .expand({n, groups, per_group})
                                .reshape({n, routing_.num_experts});
    // The experts of other groups cannot be chosen (transformers' DeepseekV3TopkRouter).
    choice = choice.masked_fill(kept.logical_not(), -std::numeric_limits<double>::infinity());
  }
  return std::get<1>(at::topk(choice, routing_.top_k, -1));
}

at::Tensor ExpertRouter::route(const at::Tensor& tokens, const at::Tensor& router_weight, const Expert& expert,
                               bool training, const at::Tensor& correction_bias) {
  const std::int64_t experts = routing_.num_experts, k = routing_.top_k, n = tokens.size(0);
  if (routing_.correction_bias != correction_bias.defined()) {
    throw Error(std::string("ExpertRouter::route: the routing ") + (routing_.correction_bias ? "has" : "has no") +
                " correction bias but the call " + (correction_bias.defined() ? "passes one" : "passes none"));
  }
  const at::Tensor scores = [&] {
    NoAutocast float32(tokens.device());
    return at::linear(tokens.to(at::kFloat), router_weight.to(at::kFloat));
  }();
  // probs: the scores as a distribution over the experts (the balance loss's P and the entropy).
  const bool sigmoid = routing_.score == RouterScore::sigmoid;
  const at::Tensor sigmoids = sigmoid ? at::sigmoid(scores) : at::Tensor();
  const at::Tensor log_probs =
      sigmoid ? at::log(sigmoids / sigmoids.sum(-1, /*keepdim=*/true)) : at::log_softmax(scores, -1);
  const at::Tensor probs = log_probs.exp();
  const at::Tensor& gate_scores = sigmoid ? sigmoids : probs;
  const at::Tensor top_experts = choose(gate_scores, correction_bias);
  const at::Tensor top_probs = gate_scores.gather(1, top_experts);
  at::Tensor gates = top_probs;
  if (routing_.renormalize_topk) {
    // DeepSeek-V3 guards the sigmoid scores' sum; a softmax's top-k never sums to 0.
    gates = top_probs / (sigmoid ? top_probs.sum(-1, /*keepdim=*/true) + 1e-20 : top_probs.sum(-1, /*keepdim=*/true));
  }
  if (routing_.routed_scaling != 1.0) gates = gates * routing_.routed_scaling;

  // Assignment a = token * k + slot is in token order. A stable sort by expert lists each
  // expert's assignments contiguously and still in token order, so capacity keeps a prefix.
  const at::Tensor chosen = top_experts.reshape({-1});
  const at::Tensor order = at::argsort(chosen, /*stable=*/true);
  const at::Tensor counts = at::bincount(chosen, {}, experts);
  const at::Tensor host_counts = counts.to(at::kCPU);  // slicing needs the counts on the host
  const auto* per_expert = host_counts.data_ptr<std::int64_t>();
  const std::int64_t limit = capacity(n);
  std::vector<std::int64_t> kept(static_cast<std::size_t>(experts));
  std::vector<at::Tensor> kept_positions;
  std::int64_t start = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    kept[static_cast<std::size_t>(e)] = std::min(per_expert[e], limit);
    kept_positions.push_back(at::arange(start, start + kept[static_cast<std::size_t>(e)], order.options()));
    start += per_expert[e];
  }
  const at::Tensor sent = order.index_select(0, at::cat(kept_positions));
  const at::Tensor rows = at::div(sent, k, "floor");
  const at::Tensor row_gates = gates.reshape({-1}).index_select(0, sent);
  // Under autocast the experts' first matmul takes its input in the autocast dtype anyway:
  // gathered (and sent to other ranks) in it, as half the bytes.
  at::Tensor inputs = tokens.index_select(0, rows);
  if (at::autocast::is_autocast_enabled(tokens.device().type())) {
    inputs = inputs.to(at::autocast::get_autocast_dtype(tokens.device().type()));
  }
  const at::Tensor y = run_experts(inputs, kept, expert);
  // Weighted in the experts' dtype, summed in the tokens' (float32 under bf16 autocast).
  const at::Tensor combined = at::zeros_like(tokens).index_add(
      0, rows, (y * row_gates.unsqueeze(1).to(y.scalar_type())).to(tokens.scalar_type()));

  const at::Tensor assignment_share = counts.to(at::kFloat) / static_cast<double>(std::max<std::int64_t>(n * k, 1));
  aux_loss_ = static_cast<double>(experts) * (assignment_share * probs.mean(0)).sum();
  z_loss_ = at::logsumexp(scores, {-1}).pow(2).mean();
  if (training) {
    c10::NoGradGuard no_grad;
    if (!sums_.expert_assignments.defined()) {
      const auto options = probs.options();
      sums_.expert_assignments = at::zeros({experts}, options);
      for (at::Tensor* sum : {&sums_.dropped_assignments, &sums_.tokens, &sums_.entropy_sum, &sums_.aux_loss_sum,
                              &sums_.z_loss_sum}) {
        *sum = at::zeros({}, options);
      }
    }
    sums_.expert_assignments.add_(counts.to(at::kFloat));
    loads_ = loads_.defined() ? loads_.add_(counts.to(at::kFloat)) : counts.to(at::kFloat);
    sums_.dropped_assignments.add_((counts - limit).clamp_min(0).sum().to(at::kFloat));
    sums_.tokens.add_(static_cast<double>(n));
    sums_.entropy_sum.add_(-(probs * log_probs).sum());
    sums_.aux_loss_sum.add_(aux_loss_.detach());
    sums_.z_loss_sum.add_(z_loss_.detach());
    ++sums_.forwards;
  }
  return combined;
}

at::Tensor ExpertRouter::run_experts(const at::Tensor& rows, const std::vector<std::int64_t>& kept,
                                     const Expert& expert) const {
  const std::int64_t mine = local_experts();
  // Rows grouped by expert (kept[e] each): each of this rank's experts on its group, in order.
  auto run_grouped = [&](const at::Tensor& grouped, const std::vector<std::int64_t>& sizes) {
    std::vector<at::Tensor> outputs;
    std::int64_t offset = 0;
    for (std::int64_t e = 0; e < mine; ++e) {
      outputs.push_back(expert(e, grouped.narrow(0, offset, sizes[static_cast<std::size_t>(e)])));
      offset += sizes[static_cast<std::size_t>(e)];
    }
    return at::cat(outputs, 0);
  };
  if (ep_.size() == 1) return run_grouped(rows, kept);

  // How many rows this rank sends each peer for each of its experts, and receives.
  const std::int64_t peers = ep_.size();
  const at::Tensor receiving =
      collectives::all_to_all_along(at::tensor(kept, at::kLong).view({peers, mine}), 0, 0, *ep_.group());
  const auto* got = receiving.data_ptr<std::int64_t>();  // [peer, expert]
  std::vector<std::int64_t> send_rows(static_cast<std::size_t>(peers)), recv_rows(static_cast<std::size_t>(peers));
  std::vector<std::int64_t> per_expert(static_cast<std::size_t>(mine));
  for (std::int64_t r = 0; r < peers; ++r) {
    for (std::int64_t e = 0; e < mine; ++e) {
      send_rows[static_cast<std::size_t>(r)] += kept[static_cast<std::size_t>(r * mine + e)];
      recv_rows[static_cast<std::size_t>(r)] += got[r * mine + e];
      per_expert[static_cast<std::size_t>(e)] += got[r * mine + e];
    }
  }
  const at::Tensor arrived = collectives::all_to_all_rows(rows, send_rows, recv_rows, ep_.group());
  // Arrived by peer, then by expert within a peer's: regrouped by expert (one gather), run, and
  // put back in arrival order (another) for the return trip.
  std::vector<std::vector<at::Tensor>> positions(static_cast<std::size_t>(mine));
  std::int64_t offset = 0;
  for (std::int64_t r = 0; r < peers; ++r) {
    for (std::int64_t e = 0; e < mine; ++e) {
      const std::int64_t count = got[r * mine + e];
      positions[static_cast<std::size_t>(e)].push_back(at::arange(offset, offset + count, at::kLong));
      offset += count;
    }
  }
  std::vector<at::Tensor> by_expert;
  for (auto& p : positions) by_expert.push_back(at::cat(p));
  const at::Tensor grouping = at::cat(by_expert).to(rows.device());
  const at::Tensor outputs = run_grouped(arrived.index_select(0, grouping), per_expert);
  const at::Tensor in_arrival_order = outputs.index_select(0, at::argsort(grouping));
  return collectives::all_to_all_rows(in_arrival_order, recv_rows, send_rows, ep_.group());
}

at::Tensor ExpertRouter::take_loads() { return std::exchange(loads_, at::Tensor()); }

RouterStatistics ExpertRouter::take_statistics(const at::TensorOptions& options) {
  RouterStatistics out;
  if (!sums_.expert_assignments.defined()) {
    out.expert_assignments = at::zeros({routing_.num_experts}, options);
    for (at::Tensor* sum : {&out.dropped_assignments, &out.tokens, &out.entropy_sum, &out.aux_loss_sum, &out.z_loss_sum}) {
      *sum = at::zeros({}, options);
    }
    return out;
  }
  out = std::move(sums_);
  sums_ = RouterStatistics();
  return out;
}

}  // namespace tessera
