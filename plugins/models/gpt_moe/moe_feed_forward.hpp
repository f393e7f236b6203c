// The mixture-of-experts feed-forward layer of model/gpt_moe (header only, compiled into that
// plugin alone): a top-k router, the experts stacked into one tensor per weight, capacity, the
// balancing and z-losses, and the routing sums monitors read (tessera::RouterStatistics).
#pragma once

#include <ATen/ops/argsort.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/div.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "../gpt/transformer_parts.hpp"
#include "gpt_moe_config.hpp"
#include "tessera/moe.hpp"
#include "tessera/precision.hpp"

namespace tessera::gpt_moe {

using gpt_parts::linear_layer;

// Routing sums of one MoE layer since the last take (tessera::RouterStatistics).
class RoutingSums {
 public:
  void add(const at::Tensor& assignments, const at::Tensor& dropped, double tokens, const at::Tensor& entropy,
           const at::Tensor& aux, const at::Tensor& z) {
    if (!assignments_.defined()) {
      const auto options = assignments.options().dtype(at::kFloat);
      assignments_ = at::zeros(assignments.sizes(), options);
      dropped_ = at::zeros({}, options);
      tokens_ = at::zeros({}, options);
      entropy_ = at::zeros({}, options);
      aux_ = at::zeros({}, options);
      z_ = at::zeros({}, options);
    }
    assignments_.add_(assignments);
    dropped_.add_(dropped);
    tokens_.add_(tokens);
    entropy_.add_(entropy);
    aux_.add_(aux);
    z_.add_(z);
    ++forwards_;
  }

  // Hands the sums over (zeros on `options` when nothing was routed) and starts again.
  tessera::RouterStatistics take(std::int64_t experts, const at::TensorOptions& options) {
    tessera::RouterStatistics out;
    if (!assignments_.defined()) {
      out.expert_assignments = at::zeros({experts}, options);
      for (at::Tensor* sum : {&out.dropped_assignments, &out.tokens, &out.entropy_sum, &out.aux_loss_sum, &out.z_loss_sum}) {
        *sum = at::zeros({}, options);
      }
      return out;
    }
    out.expert_assignments = std::move(assignments_);
    out.dropped_assignments = std::move(dropped_);
    out.tokens = std::move(tokens_);
    out.entropy_sum = std::move(entropy_);
    out.aux_loss_sum = std::move(aux_);
    out.z_loss_sum = std::move(z_);
    out.forwards = forwards_;
    *this = RoutingSums();
    return out;
  }

 private:
  at::Tensor assignments_, dropped_, tokens_, entropy_, aux_, z_;
  std::int64_t forwards_ = 0;
};

// One linear layer per expert, stacked: weight [E, out, in], bias [E, out].
class ExpertLinear : public torch::nn::Module {
 public:
  ExpertLinear(std::int64_t experts, std::int64_t in, std::int64_t out, bool with_bias) {
    // On the meta device while the host defers initialisation (the model initialises them).
    weight = register_parameter("weight", tessera::new_parameter({experts, out, in}));
    if (with_bias) bias = register_parameter("bias", gpt_parts::parameter({experts, out}, 0.0));
  }
  // Per-expert views; unbinding once per forward keeps backward to one stack per tensor.
  std::vector<at::Tensor> weights() const { return weight.unbind(0); }
  std::vector<at::Tensor> biases() const {
    return bias.defined() ? bias.unbind(0) : std::vector<at::Tensor>(static_cast<std::size_t>(weight.size(0)));
  }

  at::Tensor weight, bias;
};

// A mixture-of-experts feed-forward: a linear router (fp32 softmax) sends each token to its top-k
// experts, each a GELU MLP; their outputs are summed with the gate weights. Parameters:
// router.weight [E, C], experts.c_fc.{weight [E, H, C], bias}, experts.c_proj.{weight [E, C, H], bias}.
class MoeFeedForward : public torch::nn::Module {
 public:
  explicit MoeFeedForward(const GptMoeConfig& s) : s_(s) {
    router = register_module("router", linear_layer(s.n_embd, s.num_experts, false));
    auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
    up = experts->register_module("c_fc", std::make_shared<ExpertLinear>(s.num_experts, s.n_embd, s.expert_width(), s.bias));
    down = experts->register_module("c_proj", std::make_shared<ExpertLinear>(s.num_experts, s.expert_width(), s.n_embd, s.bias));
  }

  at::Tensor forward(const at::Tensor& x) {
    const std::int64_t experts = s_.num_experts, k = s_.top_k;
    const at::Tensor tokens = x.reshape({-1, x.size(-1)});
    const std::int64_t n = tokens.size(0);

    // Router in fp32 whatever the model's precision: small logit differences decide the experts.
    // The router in float32 even under bf16 autocast: its top-k choices and balancing losses
    // should not depend on bf16 rounding of nearly equal scores.
    const at::Tensor logits = [&] {
      tessera::NoAutocast float32(tokens.device());
      return at::linear(tokens.to(at::kFloat), router->weight.to(at::kFloat));
    }();
    const at::Tensor log_probs = at::log_softmax(logits, -1);
    const at::Tensor probs = log_probs.exp();
    auto [top_probs, top_experts] = at::topk(probs, k, -1);
    const at::Tensor gates = s_.renormalize_topk ? top_probs / top_probs.sum(-1, /*keepdim=*/true) : top_probs;

    // Assignment a = token * k + slot is in token order. A stable sort by expert lists each
    // expert's assignments contiguously and still in token order, so capacity keeps a prefix.
    const at::Tensor chosen = top_experts.reshape({-1});
    const at::Tensor order = at::argsort(chosen, /*stable=*/true);
    const at::Tensor token_of = at::div(order, k, "floor");
    const at::Tensor gate_of = gates.reshape({-1}).index_select(0, order);
    const at::Tensor counts = at::bincount(chosen, {}, experts);
    const at::Tensor host_counts = counts.to(at::kCPU);  // slicing needs the counts on the host
    const auto* per_expert = host_counts.data_ptr<std::int64_t>();
    const std::int64_t capacity = capacity_per_expert(n);

    // Every expert runs, with zero rows when it got none, so each of its parameters gets a
    // gradient in every backward (ddp's buckets and fsdp's units expect that).
    const auto w_up = up->weights(), b_up = up->biases(), w_down = down->weights(), b_down = down->biases();
    at::Tensor combined = at::zeros_like(tokens);
    std::int64_t start = 0;
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::int64_t kept = std::min(per_expert[e], capacity);
      const at::Tensor rows = token_of.narrow(0, start, kept);
      at::Tensor y = at::linear(at::gelu(at::linear(tokens.index_select(0, rows), w_up[e], b_up[e])), w_down[e],
                                b_down[e]);
      y = y * gate_of.narrow(0, start, kept).unsqueeze(1).to(y.scalar_type());
      // Summed in the tokens' dtype (float32 under bf16 autocast, whose products come out bf16).
      combined = combined.index_add(0, rows, y.to(combined.scalar_type()));
      start += per_expert[e];
    }

    // Switch/GShard balance: E * sum_e f_e * P_e, f_e = share of assignments (before drops),
    // P_e = mean router probability; 1 when uniform. Router z-loss: mean logsumexp(logits)^2.
    const at::Tensor assignment_share = counts.to(at::kFloat) / static_cast<double>(std::max<std::int64_t>(n * k, 1));
    last_aux_loss = static_cast<double>(experts) * (assignment_share * probs.mean(0)).sum();
    last_z_loss = at::logsumexp(logits, {-1}).pow(2).mean();

    if (is_training()) {
      c10::NoGradGuard no_grad;
      const at::Tensor dropped = (counts - capacity).clamp_min(0).sum().to(at::kFloat);
      const at::Tensor entropy = -(probs * log_probs).sum();
      sums_.add(counts.to(at::kFloat), dropped, static_cast<double>(n), entropy, last_aux_loss.detach(),
                last_z_loss.detach());
    }
    return at::dropout(combined.view(x.sizes()), s_.dropout, is_training());
  }

  // ceil(capacity_factor * tokens * k / E) assignments per expert; all of them without a factor.
  std::int64_t capacity_per_expert(std::int64_t tokens) const {
    if (s_.capacity_factor <= 0) return tokens * s_.top_k;
    return static_cast<std::int64_t>(std::ceil(s_.capacity_factor * static_cast<double>(tokens * s_.top_k) /
                                               static_cast<double>(s_.num_experts)));
  }

  tessera::RouterStatistics take_statistics() {
    return sums_.take(s_.num_experts, router->weight.options().dtype(at::kFloat));
  }

  std::shared_ptr<gpt_parts::Affine> router;
  std::shared_ptr<ExpertLinear> up, down;
  at::Tensor last_aux_loss, last_z_loss;  // unweighted, from the last forward (with their graph)

 private:
  GptMoeConfig s_;
  RoutingSums sums_;
};

}  // namespace tessera::gpt_moe
