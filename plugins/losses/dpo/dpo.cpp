// Loss `dpo`: direct preference optimisation over dataset/preference_jsonl's pairs (rows 2k, chosen,
// and 2k + 1, rejected), with TRL's DPOTrainer formulas. Each row's log-probability is the sum of
// log p(token) over its completion's tokens (ipo: their mean, as TRL), for the policy and for the
// reference model, which the trainer computes first (Loss::needs_reference: the base with the
// adapters switched off). With h = (chosen - rejected) of the policy minus that of the reference:
//   sigmoid: -log σ(βh)(1 - ε) - log σ(-βh) ε;   ipo: (h - 1/(2β))²;   hinge: max(0, 1 - βh).
// The loss sums over the batch's pairs and counts them, so the trainer's normalisation gives the
// mean over every pair of the step. TRL's metrics (rewards/*, logps/*) are kept as step sums.
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/log_sigmoid.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/components/loss.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/plugin.hpp"
#include "tessera/run/batch.hpp"

namespace {

struct DpoConfig {
  double beta = 0.1;
  std::string loss_type = "sigmoid";
  double label_smoothing = 0.0;

  static void declare(tessera::ConfigFields<DpoConfig>& f) {
    f.field("beta", &DpoConfig::beta, "how far the policy may move from the reference (TRL's beta)").greater_than(0);
    f.field("loss_type", &DpoConfig::loss_type, "sigmoid (DPO), ipo (IPO, on mean log-probabilities) or hinge (SLiC)")
        .one_of({"sigmoid", "ipo", "hinge"});
    f.field("label_smoothing", &DpoConfig::label_smoothing,
            "sigmoid only: the share of pairs taken as mislabelled (conservative DPO)")
        .at_least(0)
        .less_than(0.5);
  }
};

// Each row's summed log-probability of its targets, and how many it has.
std::pair<at::Tensor, at::Tensor> sequence_logps(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor mask = labels.ne(tessera::kIgnoreIndex);
  const at::Tensor safe = labels.masked_fill(mask.logical_not(), 0);
  const at::Tensor logp = at::log_softmax(logits.to(at::kFloat), -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1);
  return {logp.masked_fill(mask.logical_not(), 0).sum(-1), mask.sum(-1).to(at::kFloat)};
}

class DpoLoss final : public tessera::Loss {
 public:
  explicit DpoLoss(const DpoConfig& c) : c_(c) {}

  bool needs_reference() const override { return true; }

  void take_reference(const at::Tensor& logits, const at::Tensor& labels) override {
    at::NoGradGuard no_grad;
    reference_ = sequence_logps(logits, labels).first;
  }

  tessera::LossSum compute(const at::Tensor& logits, const at::Tensor& labels) override {
    const std::int64_t rows = logits.size(0);
    if (rows % 2 != 0) {
      throw tessera::Error("loss/dpo takes pairs of rows (chosen, rejected), as dataset/preference_jsonl gives them; "
                           "this batch has " + std::to_string(rows) + " rows");
    }
    if (!reference_.defined() || reference_.size(0) != rows) {
      throw tessera::Error("loss/dpo: no reference log-probabilities for this batch (the trainer computes them for "
                           "training steps; evaluating loss/dpo is not supported yet)");
    }
    auto [policy, counts] = sequence_logps(logits, labels);
    at::Tensor reference = std::exchange(reference_, at::Tensor());
    if (c_.loss_type == "ipo") {  // TRL's IPO compares mean log-probabilities
      policy = policy / counts.clamp_min(1);
      reference = reference / counts.clamp_min(1);
    }
    const at::Tensor chosen = policy.slice(0, 0, rows, 2), rejected = policy.slice(0, 1, rows, 2);
    const at::Tensor ref_chosen = reference.slice(0, 0, rows, 2), ref_rejected = reference.slice(0, 1, rows, 2);
    const at::Tensor h = (chosen - rejected) - (ref_chosen - ref_rejected);
    at::Tensor losses;
    if (c_.loss_type == "sigmoid") {
      losses = -at::log_sigmoid(c_.beta * h) * (1 - c_.label_smoothing) - at::log_sigmoid(-c_.beta * h) * c_.label_smoothing;
    } else if (c_.loss_type == "ipo") {
      losses = (h - 1 / (2 * c_.beta)).square();
    } else {
      losses = at::relu(1 - c_.beta * h);
    }
    keep_metrics(chosen.detach(), rejected.detach(), ref_chosen, ref_rejected);
    return {losses.sum(), at::scalar_tensor(rows / 2, at::TensorOptions().dtype(at::kLong).device(logits.device()))};
  }

  std::vector<std::string> metric_names() const override {
    return {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected"};
  }
  at::Tensor take_metric_sums() override { return std::exchange(sums_, at::Tensor()); }

 private:
  // TRL's: rewards are β times the policy's log-probability over the reference's.
  void keep_metrics(const at::Tensor& chosen, const at::Tensor& rejected, const at::Tensor& ref_chosen,
                    const at::Tensor& ref_rejected) {
    const at::Tensor reward_chosen = c_.beta * (chosen - ref_chosen), reward_rejected = c_.beta * (rejected - ref_rejected);
    const at::Tensor step = at::stack({reward_chosen.sum(), reward_rejected.sum(),
                                       reward_chosen.gt(reward_rejected).to(at::kFloat).sum(),
                                       (reward_chosen - reward_rejected).sum(), chosen.sum(), rejected.sum(),
                                       at::scalar_tensor(static_cast<double>(chosen.size(0)), chosen.options())});
    sums_ = sums_.defined() ? sums_ + step : step;
  }

  DpoConfig c_;
  at::Tensor reference_;
  at::Tensor sums_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Loss, DpoConfig>(
      "dpo", "direct preference optimisation over chosen/rejected pairs against the reference (the base, adapters off)",
      [](const DpoConfig& c) { return std::make_shared<DpoLoss>(c); });
}

}  // namespace

TESSERA_PLUGIN("loss_dpo", "0.1.0", register_components)
