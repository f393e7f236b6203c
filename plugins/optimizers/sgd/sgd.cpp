// Optimizer `sgd`: torch::optim::SGD over a model's parameters, with optional (Nesterov)
// momentum and L2 weight decay.
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "tessera/model.hpp"
#include "tessera/optimizer.hpp"
#include "tessera/plugin.hpp"

namespace {

// Key of one parameter's momentum buffer, index in parameters() order.
std::string momentum_key(std::size_t index) {
  return "param." + std::to_string(index) + ".momentum_buffer";
}

class SgdOptimizer final : public tessera::Optimizer {
 public:
  explicit SgdOptimizer(const tessera::ComponentConfig& config)
      : model_(config.component<tessera::Model>("model")), base_lr_(config.number("lr")) {
    const double momentum = config.number("momentum");
    const bool nesterov = config.boolean("nesterov");
    if (nesterov && momentum <= 0) {
      throw tessera::ConfigError("nesterov needs momentum > 0", "nesterov");
    }
    for (const at::Tensor& p : model_->parameters()) {
      if (p.requires_grad()) params_.push_back(p);
    }
    if (params_.empty()) {
      throw tessera::ConfigError("the model has no trainable parameters", "model");
    }
    auto options =
        torch::optim::SGDOptions(base_lr_).momentum(momentum).nesterov(nesterov).weight_decay(
            config.number("weight_decay"));
    optimizer_ = std::make_unique<torch::optim::SGD>(params_, options);
  }

  void step() override { optimizer_->step(); }
  void zero_grad() override { optimizer_->zero_grad(/*set_to_none=*/true); }
  double base_lr() const override { return base_lr_; }
  void set_lr(double lr) override {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  }
  std::vector<at::Tensor> parameters() const override { return params_; }

  // Copies, so a later step cannot change a state dict already handed to a checkpoint.
  // Without momentum SGD has no state and the dict is empty.
  tessera::StateDict state_dict() const override {
    tessera::StateDict state;
    const auto& torch_state = optimizer_->state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto it = torch_state.find(params_[i].unsafeGetTensorImpl());
      if (it == torch_state.end()) continue;
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      state[momentum_key(i)] = s.momentum_buffer().clone();
    }
    return state;
  }

  void load_state_dict(const tessera::StateDict& state) override {
    std::size_t restored = 0;
    auto& torch_state = optimizer_->state();
    torch_state.clear();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::string key = momentum_key(i);
      auto it = state.find(key);
      if (it == state.end()) continue;
      const at::Tensor& param = params_[i];
      if (it->second.sizes() != param.sizes()) {
        throw tessera::Error("optimizer/sgd state: " + key + " has shape " +
                             c10::str(it->second.sizes()) + " but the parameter has " +
                             c10::str(param.sizes()));
      }
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(it->second.to(param.options(), /*non_blocking=*/false, /*copy=*/true));
      torch_state[param.unsafeGetTensorImpl()] = std::move(s);
      ++restored;
    }
    // Every key must have been used: anything else belongs to another optimizer or model.
    if (restored != state.size()) {
      throw tessera::Error("optimizer/sgd state: " + std::to_string(state.size() - restored) +
                           " keys are not momentum buffers of this optimizer's " +
                           std::to_string(params_.size()) + " parameters");
    }
  }

 private:
  std::shared_ptr<tessera::Model> model_;  // keeps the parameters alive
  double base_lr_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
};

void register_components(tessera::Registrar& registrar) {
  tessera::Schema schema;
  schema.component("model", "model", "the model whose parameters are optimised");
  schema.number("lr", "base learning rate (the scheduler multiplies it)")
      .default_to(1e-3)
      .greater_than(0);
  schema.number("momentum", "momentum factor (0 = plain SGD)").default_to(0.0).at_least(0);
  schema.boolean("nesterov", "use Nesterov momentum (needs momentum > 0)").default_to(false);
  schema.number("weight_decay", "L2 penalty added to the gradient").default_to(0.0).at_least(0);
  registrar.add<tessera::Optimizer>(
      "sgd", "stochastic gradient descent with optional (Nesterov) momentum", schema,
      [](const tessera::ComponentConfig& c) { return std::make_shared<SgdOptimizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("optimizer_sgd", "0.1.0", register_components)
