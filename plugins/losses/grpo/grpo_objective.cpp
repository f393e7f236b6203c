// GRPO's objective (grpo_objective.hpp): TRL 1.16's lines in ATen.
#include "grpo_objective.hpp"

#include <ATen/ops/clamp.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>

#include "tessera/error.hpp"

namespace tessera_plugins::grpo {

ObjectiveTerms objective_terms(const at::Tensor& logps, const at::Tensor& old_logps, const at::Tensor& ref_logps,
                               const at::Tensor& advantages, const at::Tensor& mask, const ObjectiveSettings& s) {
  const at::Tensor old = old_logps.defined() ? old_logps : logps.detach();
  const at::Tensor adv = advantages.dim() == 1 ? advantages.unsqueeze(1) : advantages;
  const at::Tensor log_ratio = logps - old;
  at::Tensor log_weights;
  if (s.importance_sampling_level == "token") {
    log_weights = log_ratio;
  } else if (s.importance_sampling_level == "sequence") {
    log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)).unsqueeze(-1);
  } else {
    throw tessera::Error("loss/grpo: importance_sampling_level must be token or sequence");
  }
  at::Tensor coef_1 = at::exp(log_weights);
  ObjectiveTerms out;
  if (s.beta != 0.0) {
    if (!ref_logps.defined()) throw tessera::Error("loss/grpo: beta != 0 needs the reference model's log-probabilities");
    const at::Tensor diff = ref_logps - logps;
    out.per_token_kl = at::exp(diff) - diff - 1;
    // Weighted as the policy term is (before delta caps the weight), TRL's bias correction.
    if (s.use_bias_correction_kl) out.per_token_kl = out.per_token_kl * coef_1;
  }
  const at::Tensor coef_2 = at::clamp(coef_1, 1 - s.epsilon_low, 1 + s.epsilon_high);
  if (s.delta) coef_1 = at::clamp_max(coef_1, *s.delta);
  out.per_token_loss = -at::minimum(coef_1 * adv, coef_2 * adv);
  if (s.beta != 0.0) out.per_token_loss = out.per_token_loss + s.beta * out.per_token_kl;
  out.low_clipped = (coef_1 < 1 - s.epsilon_low).logical_and(adv < 0);
  out.high_clipped = (coef_1 > 1 + s.epsilon_high).logical_and(adv > 0);
  return out;
}

LossSum aggregate(const at::Tensor& per_token_loss, const at::Tensor& mask, const ObjectiveSettings& s) {
  const at::Tensor masked = per_token_loss * mask;
  const at::Tensor sequences = at::scalar_tensor(static_cast<double>(per_token_loss.size(0)), mask.options());
  if (s.loss_type == "dapo") return {masked.sum(), mask.sum().clamp_min(1.0)};
  if (s.loss_type == "grpo") return {(masked.sum(-1) / mask.sum(-1).clamp_min(1.0)).sum(), sequences};
  if (s.loss_type == "dr_grpo") return {masked.sum() / static_cast<double>(s.max_completion_length), sequences};
  if (s.loss_type == "bnpo") return {masked.sum() / mask.sum().clamp_min(1.0), at::ones({}, mask.options())};
  throw tessera::Error("loss/grpo: loss_type must be grpo, bnpo, dr_grpo or dapo, got '" + s.loss_type + "'");
}

}  // namespace tessera_plugins::grpo
