// Optimizer `adamw`: AdamW with decoupled weight decay, fused, foreach or loop (see
// ../multi_tensor_optimizer.hpp). By default biases and norm weights (tensors with fewer than 2
// dimensions) are not decayed, as in GPT training.
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../multi_tensor_optimizer.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera_plugins::OptimizerImplementation;

struct AdamWConfig {
  std::shared_ptr<tessera::Model> model;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decay_norm_and_bias = false;
  std::string implementation = "auto";

  static void declare(tessera::ConfigFields<AdamWConfig>& f) {
    using C = AdamWConfig;
    f.field("model", &C::model, "the model whose parameters are optimised");
    f.field("lr", &C::lr, "base learning rate (the scheduler multiplies it)").greater_than(0);
    f.field("beta1", &C::beta1, "decay of the first-moment average").at_least(0).less_than(1);
    f.field("beta2", &C::beta2, "decay of the second-moment average").at_least(0).less_than(1);
    f.field("eps", &C::eps, "added to the denominator for stability").greater_than(0);
    f.field("weight_decay", &C::weight_decay, "decoupled weight decay").at_least(0);
    f.field("decay_norm_and_bias", &C::decay_norm_and_bias, "also decay tensors with fewer than 2 dimensions");
    f.field("implementation", &C::implementation, tessera_plugins::kImplementationDoc)
        .one_of({"auto", "fused", "foreach", "loop"});
  }
};

class AdamWOptimizer final : public tessera_plugins::MultiTensorOptimizer {
 public:
  explicit AdamWOptimizer(const AdamWConfig& config)
      : MultiTensorOptimizer(config.model, config.lr, config.implementation, "optimizer/adamw"),
        beta1_(config.beta1),
        beta2_(config.beta2),
        eps_(config.eps) {
    std::vector<at::Tensor> decayed, not_decayed;
    for (const at::Tensor& p : trainable_parameters()) {
      (config.decay_norm_and_bias || p.dim() >= 2 ? decayed : not_decayed).push_back(p);
    }
    adopt({std::move(decayed), std::move(not_decayed)}, {config.weight_decay, 0.0});
  }

  void step() override {
    const OptimizerImplementation how = implementation();
    for (const auto& group : groups_) {
      const std::vector<std::size_t> members = active(group);
      if (members.empty()) continue;
      for (std::size_t i : members) state_[i].step += 1;
      switch (how) {
        case OptimizerImplementation::fused:
          for (const auto& same_kind : by_device_and_dtype(members)) fused_step(group, same_kind);
          break;
        case OptimizerImplementation::foreach: foreach_step(group, members); break;
        case OptimizerImplementation::loop: loop_step(group, members); break;
      }
    }
    found_inf_ = at::Tensor();  // for one step only
  }

  // The fused kernel takes the flag itself (as PyTorch's GradScaler uses it): where it is 1 the
  // kernel writes nothing, and the device step counts it advanced are taken back.
  bool can_skip_on_device() const override { return implementation() == OptimizerImplementation::fused; }
  void skip_next_step_if(const at::Tensor& found_inf) override { found_inf_ = found_inf; }

 protected:
  std::vector<std::string> fields_of(std::size_t) const override { return {"exp_avg", "exp_avg_sq"}; }
  bool saves_step_of(std::size_t) const override { return true; }

 private:
  double bias_correction1(std::int64_t step) const { return 1.0 - std::pow(beta1_, static_cast<double>(step)); }
  double bias_correction2(std::int64_t step) const { return 1.0 - std::pow(beta2_, static_cast<double>(step)); }

  // torch::optim::AdamW's arithmetic, one parameter at a time: the reference.
  void loop_step(const tessera_plugins::ParamGroup& group, const std::vector<std::size_t>& members) {
    for (std::size_t i : members) {
      at::Tensor& p = params_[i];
      const at::Tensor& grad = p.grad();
      at::Tensor& exp_avg = state_[i].fields[0];
      at::Tensor& exp_avg_sq = state_[i].fields[1];
      const std::int64_t step = state_[i].step;
      auto data = p.detach();
      if (group.weight_decay != 0) data.mul_(1.0 - lr_ * group.weight_decay);
      exp_avg.mul_(beta1_).add_(grad, 1.0 - beta1_);
      exp_avg_sq.mul_(beta2_).addcmul_(grad, grad, 1.0 - beta2_);
      at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2(step))).add_(eps_);
      data.addcdiv_(exp_avg, denom, -lr_ / bias_correction1(step));
    }
  }

  // The loop's arithmetic, every op over all of the group's tensors at once.
  void foreach_step(const tessera_plugins::ParamGroup& group, const std::vector<std::size_t>& members) {
    std::vector<at::Tensor> params = params_of(members);
    std::vector<at::Tensor> exp_avgs = gather(members, 0), exp_avg_sqs = gather(members, 1);
    std::vector<std::int64_t> steps;
    for (std::size_t i : members) steps.push_back(state_[i].step);
    tessera_plugins::adamw_foreach_update(params, grads_of(members), exp_avgs, exp_avg_sqs, steps,
                                          {lr_, beta1_, beta2_, eps_, group.weight_decay});
  }

  // LibTorch's fused kernel; its step counts live on the device beside the parameters.
  void fused_step(const tessera_plugins::ParamGroup& group, const std::vector<std::size_t>& members) {
    std::vector<at::Tensor> steps;
    for (std::size_t i : members) {
      auto& s = state_[i];
      // Created (or re-created after a load) from the host count; afterwards advanced on the device.
      if (!s.device_step.defined()) {
        s.device_step = at::full({}, static_cast<double>(s.step - 1), params_[i].options().dtype(at::kFloat));
      }
      steps.push_back(s.device_step);
    }
    std::optional<at::Tensor> found_inf;
    if (found_inf_.defined()) found_inf = found_inf_.to(params_[members.front()].device(), at::kFloat);
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params_of(members), grads_of(members), gather(members, 0), gather(members, 1),
                      /*max_exp_avg_sqs=*/{}, steps, lr_, beta1_, beta2_, group.weight_decay, eps_,
                      /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
    if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
  }

  double beta1_, beta2_, eps_;
  at::Tensor found_inf_;  // skip_next_step_if's flag, until the next step
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Optimizer, AdamWConfig>(
      "adamw", "AdamW with decoupled weight decay, fused or multi-tensor (biases and norms undecayed by default)",
      [](const AdamWConfig& c) { return std::make_shared<AdamWOptimizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("optimizer_adamw", "0.1.0", register_components)
