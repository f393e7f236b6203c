// Optimizer `adamw`: torch::optim::AdamW over a model's parameters. By default biases and norm
// weights (tensors with fewer than 2 dimensions) are not decayed, as in GPT training.
#include <ATen/ops/scalar_tensor.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tessera/model.hpp"
#include "tessera/optimizer.hpp"
#include "tessera/plugin.hpp"

namespace {

// Keys of one parameter's saved state: "param.<index>.<field>", index in parameters() order.
std::string state_key(std::size_t index, const char* field) {
  return "param." + std::to_string(index) + "." + field;
}

const at::Tensor& saved_tensor(const tessera::StateDict& state, const std::string& key) {
  auto it = state.find(key);
  if (it == state.end()) throw tessera::Error("optimizer/adamw state: missing " + key);
  return it->second;
}

// A copy of a saved moment, placed like the parameter it belongs to.
at::Tensor restore_like(const at::Tensor& saved, const at::Tensor& param, const std::string& key) {
  if (saved.sizes() != param.sizes()) {
    throw tessera::Error("optimizer/adamw state: " + key + " has shape " + c10::str(saved.sizes()) +
                         " but the parameter has " + c10::str(param.sizes()));
  }
  return saved.to(param.options(), /*non_blocking=*/false, /*copy=*/true);
}

class AdamWOptimizer final : public tessera::Optimizer {
 public:
  explicit AdamWOptimizer(const tessera::ComponentConfig& config)
      : model_(config.component<tessera::Model>("model")), base_lr_(config.number("lr")) {
    auto options = torch::optim::AdamWOptions(base_lr_)
                       .betas(std::make_tuple(config.number("beta1"), config.number("beta2")))
                       .eps(config.number("eps"))
                       .weight_decay(config.number("weight_decay"));

    std::vector<at::Tensor> decayed, not_decayed;
    for (const at::Tensor& p : model_->parameters()) {
      if (!p.requires_grad()) continue;
      const bool decay = config.boolean("decay_norm_and_bias") || p.dim() >= 2;
      (decay ? decayed : not_decayed).push_back(p);
    }
    if (decayed.empty() && not_decayed.empty()) {
      throw tessera::ConfigError("the model has no trainable parameters", "model");
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (!decayed.empty()) {
      groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(options));
    }
    if (!not_decayed.empty()) {
      auto no_decay = options;
      no_decay.weight_decay(0.0);
      groups.emplace_back(not_decayed, std::make_unique<torch::optim::AdamWOptions>(no_decay));
    }
    optimizer_ = std::make_unique<torch::optim::AdamW>(groups, options);
    for (const auto& group : optimizer_->param_groups()) {
      params_.insert(params_.end(), group.params().begin(), group.params().end());
    }
  }

  void step() override { optimizer_->step(); }
  void zero_grad() override { optimizer_->zero_grad(/*set_to_none=*/true); }
  double base_lr() const override { return base_lr_; }
  void set_lr(double lr) override {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  }
  std::vector<at::Tensor> parameters() const override { return params_; }

  // Copies, so a later step cannot change a state dict already handed to a checkpoint.
  tessera::StateDict state_dict() const override {
    tessera::StateDict state;
    const auto& torch_state = optimizer_->state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto it = torch_state.find(params_[i].unsafeGetTensorImpl());
      if (it == torch_state.end()) continue;  // never stepped
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      state[state_key(i, "step")] = at::scalar_tensor(s.step(), at::kLong);
      state[state_key(i, "exp_avg")] = s.exp_avg().clone();
      state[state_key(i, "exp_avg_sq")] = s.exp_avg_sq().clone();
    }
    return state;
  }

  void load_state_dict(const tessera::StateDict& state) override {
    std::size_t used_keys = 0;
    auto& torch_state = optimizer_->state();
    torch_state.clear();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::string step_key = state_key(i, "step");
      if (state.count(step_key) == 0) continue;  // never stepped when saved
      const std::string avg_key = state_key(i, "exp_avg");
      const std::string sq_key = state_key(i, "exp_avg_sq");
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(saved_tensor(state, step_key).item<std::int64_t>());
      s->exp_avg(restore_like(saved_tensor(state, avg_key), params_[i], avg_key));
      s->exp_avg_sq(restore_like(saved_tensor(state, sq_key), params_[i], sq_key));
      torch_state[params_[i].unsafeGetTensorImpl()] = std::move(s);
      used_keys += 3;
    }
    // Every key must have been used: anything else belongs to another optimizer or model.
    if (used_keys != state.size()) {
      throw tessera::Error("optimizer/adamw state: " + std::to_string(state.size() - used_keys) +
                           " keys are not moments of this optimizer's " +
                           std::to_string(params_.size()) + " parameters");
    }
  }

 private:
  std::shared_ptr<tessera::Model> model_;  // keeps the parameters alive
  double base_lr_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::vector<at::Tensor> params_;  // every optimised parameter, in param-group order
};

void register_components(tessera::Registrar& registrar) {
  tessera::Schema schema;
  schema.component("model", "model", "the model whose parameters are optimised");
  schema.number("lr", "base learning rate (the scheduler multiplies it)")
      .default_to(1e-3)
      .greater_than(0);
  schema.number("beta1", "decay of the first-moment average")
      .default_to(0.9)
      .at_least(0)
      .less_than(1);
  schema.number("beta2", "decay of the second-moment average")
      .default_to(0.999)
      .at_least(0)
      .less_than(1);
  schema.number("eps", "added to the denominator for stability").default_to(1e-8).greater_than(0);
  schema.number("weight_decay", "decoupled weight decay").default_to(0.0).at_least(0);
  schema.boolean("decay_norm_and_bias", "also decay tensors with fewer than 2 dimensions")
      .default_to(false);
  registrar.add<tessera::Optimizer>(
      "adamw", "AdamW with decoupled weight decay (biases and norms undecayed by default)", schema,
      [](const tessera::ComponentConfig& c) { return std::make_shared<AdamWOptimizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("optimizer_adamw", "0.1.0", register_components)
