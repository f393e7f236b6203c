// Loss `grpo`: group relative policy optimisation on the model's own completions, with TRL's
// GRPOConfig names and meanings. The settings of the rollout (sampling, rewards, advantages) go to
// the trainer (Loss::rollouts, tessera/components/rollout.hpp), which samples and scores each
// step's completions; compute() is TRL's _compute_loss (grpo_objective.hpp) on a micro-batch of
// those rows: log-probabilities of the logits over the temperature, the clipped surrogate of the
// advantages, beta times the k3 KL to the reference (the base with adapters off, or a frozen copy).
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "grpo_objective.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/components/reward.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/plugin.hpp"
#include "tessera/run/batch.hpp"

namespace {

struct GrpoConfig {
  std::int64_t num_generations = 8;
  std::int64_t max_completion_length = 256;
  double temperature = 1.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;
  double min_p = 0.0;
  double beta = 0.0;
  double epsilon = 0.2;
  std::optional<double> epsilon_high;
  std::optional<double> delta;
  std::string loss_type = "dapo";
  std::string scale_rewards = "group";
  std::string importance_sampling_level = "token";
  std::int64_t num_iterations = 1;
  bool mask_truncated_completions = false;
  bool use_bias_correction_kl = true;
  std::vector<std::shared_ptr<tessera::Reward>> rewards;
  std::vector<std::string> reward_variants;  // filled from `rewards`
  std::optional<std::vector<double>> reward_weights;
  std::optional<std::vector<std::string>> reward_names;

  static void declare(tessera::ConfigFields<GrpoConfig>& f) {
    using C = GrpoConfig;
    f.field("num_generations", &C::num_generations, "completions sampled per prompt: a group").at_least(2);
    f.field("max_completion_length", &C::max_completion_length, "new tokens per completion at most").at_least(1);
    f.field("temperature", &C::temperature, "sampling temperature; log-probabilities are of the logits over it")
        .greater_than(0);
    f.field("top_p", &C::top_p, "nucleus sampling: keep the likeliest tokens up to this probability").greater_than(0).at_most(1);
    f.field("top_k", &C::top_k, "keep the k likeliest tokens; 0: all").at_least(0);
    f.field("min_p", &C::min_p, "drop tokens less likely than min_p times the likeliest; 0: none").at_least(0).at_most(1);
    f.field("beta", &C::beta, "weight of the k3 KL to the reference (the base, adapters off, or a frozen copy); 0: none")
        .at_least(0);
    f.field("epsilon", &C::epsilon, "the clip range's lower side: weights below 1 - epsilon are clipped").greater_than(0);
    f.field("epsilon_high", &C::epsilon_high, "the clip range's upper side (DAPO's clip-higher); default: epsilon")
        .greater_than(0);
    f.field("delta", &C::delta, "caps the importance weight (two-sided clipping); default: none").greater_than(1);
    f.field("loss_type", &C::loss_type, "how token losses are averaged: grpo, bnpo, dr_grpo or dapo (TRL's meanings)")
        .one_of({"grpo", "bnpo", "dr_grpo", "dapo"});
    f.field("scale_rewards", &C::scale_rewards, "advantages divided by the group's, the batch's or no standard deviation")
        .one_of({"group", "batch", "none"});
    f.field("importance_sampling_level", &C::importance_sampling_level, "token, or sequence (GSPO)")
        .one_of({"token", "sequence"});
    f.field("num_iterations", &C::num_iterations, "optimizer steps per rollout (old log-probabilities taken at the rollout)")
        .at_least(1);
    f.field("mask_truncated_completions", &C::mask_truncated_completions,
            "a completion that reached max_completion_length without an EOS gets no loss");
    f.field("use_bias_correction_kl", &C::use_bias_correction_kl, "the KL term weighted by the importance weight (TRL's)");
    f.field("rewards", &C::rewards, "the reward components, inline or by reference; a completion's reward is their weighted sum");
    f.record_variants("rewards", &C::reward_variants);
    f.field("reward_weights", &C::reward_weights, "one weight per reward; default: 1 each");
    f.field("reward_names", &C::reward_names, "one name per reward for metrics and rollouts.jsonl; default: each one's variant");
    f.check([](const C& c) {
      if (c.rewards.empty() && c.reward_variants.empty()) {
        throw tessera::ConfigError("loss/grpo needs at least one reward component", "rewards");
      }
      const std::size_t count = c.reward_variants.size();
      if (c.reward_weights && c.reward_weights->size() != count) {
        throw tessera::ConfigError("give one weight per reward: " + std::to_string(count) + " rewards, " +
                                       std::to_string(c.reward_weights->size()) + " weights",
                                   "reward_weights");
      }
      if (c.reward_names && c.reward_names->size() != count) {
        throw tessera::ConfigError("give one name per reward: " + std::to_string(count) + " rewards, " +
                                       std::to_string(c.reward_names->size()) + " names",
                                   "reward_names");
      }
    });
  }
};

// Each reward's name: the given one, else its variant, numbered where variants repeat.
std::vector<std::string> reward_names(const GrpoConfig& c) {
  if (c.reward_names) return *c.reward_names;
  std::map<std::string, int> seen;
  std::vector<std::string> names;
  for (const std::string& variant : c.reward_variants) {
    const int n = ++seen[variant];
    names.push_back(n == 1 ? variant : variant + "_" + std::to_string(n));
  }
  return names;
}

class GrpoLoss final : public tessera::Loss {
 public:
  explicit GrpoLoss(const GrpoConfig& c) {
    objective_.loss_type = c.loss_type;
    objective_.importance_sampling_level = c.importance_sampling_level;
    objective_.epsilon_low = c.epsilon;
    objective_.epsilon_high = c.epsilon_high.value_or(c.epsilon);
    objective_.delta = c.delta;
    objective_.beta = c.beta;
    objective_.use_bias_correction_kl = c.use_bias_correction_kl;
    objective_.max_completion_length = c.max_completion_length;
    rollout_.num_generations = c.num_generations;
    rollout_.max_completion_length = c.max_completion_length;
    rollout_.temperature = c.temperature;
    rollout_.top_p = c.top_p;
    rollout_.top_k = c.top_k;
    rollout_.min_p = c.min_p;
    rollout_.num_iterations = c.num_iterations;
    rollout_.mask_truncated_completions = c.mask_truncated_completions;
    rollout_.scale_rewards = c.scale_rewards;
    rollout_.units = c.loss_type == "dapo" ? "tokens" : c.loss_type == "bnpo" ? "micro_batches" : "sequences";
    const std::vector<std::string> names = reward_names(c);
    for (std::size_t i = 0; i < c.rewards.size(); ++i) {
      rollout_.rewards.push_back({names[i], c.rewards[i], c.reward_weights ? (*c.reward_weights)[i] : 1.0});
    }
  }

  const tessera::RolloutSettings* rollouts() const override { return &rollout_; }
  void take_rollout(const tessera::RolloutRows& rows) override { rows_ = rows; }
  bool needs_reference() const override { return objective_.beta != 0.0; }
  void take_reference(const at::Tensor& logits, const at::Tensor& labels) override {
    at::NoGradGuard no_grad;
    reference_ = tessera::completion_logps(logits, labels, rollout_.temperature);
  }

  tessera::LossSum compute(const at::Tensor& logits, const at::Tensor& labels) override {
    if (!rows_.advantages.defined() || rows_.advantages.size(0) != logits.size(0)) {
      throw tessera::Error("loss/grpo trains on the trainer's rollouts (their advantages are missing for this batch): "
                           "give it a prompt dataset (dataset/prompt_jsonl) as train_data; evaluating it is not supported");
    }
    const tessera::RolloutRows rows = std::exchange(rows_, tessera::RolloutRows{});
    const at::Tensor reference = std::exchange(reference_, at::Tensor());
    // One log-softmax for the objective's log-probabilities and the entropy metric.
    const at::Tensor log_probs = tessera::tempered_log_probs(logits, rollout_.temperature);
    const at::Tensor logps = tessera::label_logps(log_probs, labels);
    const at::Tensor mask = labels.ne(tessera::kIgnoreIndex).to(at::kFloat);
    const auto terms = tessera_plugins::grpo::objective_terms(logps, rows.old_logps, reference,
                                                              rows.advantages.to(logps.device()), mask, objective_);
    const auto loss = tessera_plugins::grpo::aggregate(terms.per_token_loss, mask, objective_);
    keep_metrics(log_probs, mask, terms);
    return {loss.sum, loss.units.to(at::kLong)};
  }

  std::vector<std::string> metric_names() const override {
    return {"kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"};
  }
  at::Tensor take_metric_sums() override { return std::exchange(sums_, at::Tensor()); }

 private:
  // TRL's, each a token mean over the micro-batch, kept as a sum over micro-batches and a count.
  void keep_metrics(const at::Tensor& log_probs, const at::Tensor& mask,
                    const tessera_plugins::grpo::ObjectiveTerms& t) {
    at::NoGradGuard no_grad;
    const at::Tensor tokens = mask.sum().clamp_min(1.0);
    auto token_mean = [&](const at::Tensor& per_token) { return (per_token * mask).sum() / tokens; };
    // A sequence-level clip flag [B, 1] stands for each of its tokens.
    auto clipped_mean = [&](const at::Tensor& flags) { return token_mean(flags.to(at::kFloat).expand_as(mask)); };
    const at::Tensor logp = log_probs.detach();
    const at::Tensor entropy = -(logp.exp() * logp).sum(-1);
    const at::Tensor kl = t.per_token_kl.defined() ? token_mean(t.per_token_kl.detach()) : at::zeros({}, mask.options());
    const at::Tensor step = at::stack({kl, token_mean(entropy), clipped_mean(t.low_clipped), clipped_mean(t.high_clipped),
                                       clipped_mean(t.low_clipped.logical_or(t.high_clipped)),
                                       at::ones({}, mask.options())});
    sums_ = sums_.defined() ? sums_ + step : step;
  }

  tessera_plugins::grpo::ObjectiveSettings objective_;
  tessera::RolloutSettings rollout_;
  tessera::RolloutRows rows_;
  at::Tensor reference_;
  at::Tensor sums_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Loss, GrpoConfig>(
      "grpo",
      "GRPO, DAPO, Dr. GRPO and GSPO on the model's own sampled completions, scored by reward components (TRL's GRPOConfig)",
      [](const GrpoConfig& c) { return std::make_shared<GrpoLoss>(c); });
}

}  // namespace

TESSERA_PLUGIN("loss_grpo", "0.1.0", register_components)
