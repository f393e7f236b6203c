// GRPO's objective on a micro-batch of completions, as TRL 1.16's GRPOTrainer._compute_loss
// computes it for loss_type grpo, bnpo, dr_grpo and dapo: the importance weight of each token
// (exp of the log-probability less the one the completion was sampled with) or of each
// sequence (GSPO: the exp of the mean of those), the surrogate clipped to [1 - epsilon_low,
// 1 + epsilon_high] (and the weight itself capped at delta where set: two-sided clipping), plus
// beta times the k3 estimate of the KL divergence to the reference (times the importance weight:
// TRL's use_bias_correction_kl, on by default). The loss types differ only in how token losses
// are averaged, which `aggregate` writes as a sum and the units it counts. A step's loss is its
// summed sums over its summed units (over micro-batches and ranks). That is TRL's loss exactly
// for bnpo. For grpo and dr_grpo it holds where every micro-batch holds as many completions, as
// TRL's have. For dapo it holds where a step is one generation batch (TRL's
// steps_per_generation equal to its gradient accumulation steps, its default).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tessera_plugins::grpo {

struct ObjectiveSettings {
  std::string loss_type = "dapo";                   // grpo, bnpo, dr_grpo or dapo
  std::string importance_sampling_level = "token";  // token, or sequence (GSPO)
  double epsilon_low = 0.2, epsilon_high = 0.2;     // TRL's epsilon and epsilon_high
  std::optional<double> delta;                      // cap of the importance weight (two-sided clipping)
  double beta = 0.0;                                // weight of the KL term
  bool use_bias_correction_kl = true;               // the KL term weighted by the importance weight
  std::int64_t max_completion_length = 256;         // dr_grpo's constant denominator
};

struct ObjectiveTerms {
  at::Tensor per_token_loss;  // [B, T]: the clipped surrogate's negative plus beta x KL
  at::Tensor per_token_kl;    // [B, T] k3 estimate; undefined when beta is 0
  // Where the weight left the clip range against the advantage's sign: [B, T] (token) or [B, 1]
  // (sequence), bool. TRL's clip_ratio/low_mean and high_mean are their masked means.
  at::Tensor low_clipped, high_clipped;
};

// `logps`: [B, T] log-probabilities of the completion tokens under the trained model (of logits
// divided by the sampling temperature; with gradients); `old_logps`: the same at sampling time
// (num_iterations > 1), undefined for logps' own values, detached; `ref_logps`: the reference
// model's, needed when beta != 0; `advantages`: [B]; `mask`: [B, T] float, 1 on completion tokens.
ObjectiveTerms objective_terms(const at::Tensor& logps, const at::Tensor& old_logps, const at::Tensor& ref_logps,
                               const at::Tensor& advantages, const at::Tensor& mask, const ObjectiveSettings& settings);

// A micro-batch's loss as a sum and the units a step's loss divides the sums by: dapo its tokens,
// grpo each sequence's token mean over sequences, dr_grpo tokens / max_completion_length over
// sequences, bnpo the micro-batch's token mean over micro-batches (one unit). A micro-batch of
// dapo with no completion token counts one unit, as TRL's normaliser is at least 1.
struct LossSum {
  at::Tensor sum;    // 0-dim, with gradients
  at::Tensor units;  // 0-dim float32, on the device (no wait for the host)
};
LossSum aggregate(const at::Tensor& per_token_loss, const at::Tensor& mask, const ObjectiveSettings& settings);

}  // namespace tessera_plugins::grpo
