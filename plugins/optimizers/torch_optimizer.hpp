// What the optimizers wrapping a LibTorch optimizer share (header only, included by relative
// path): stepping, the learning rate on every param group, the parameter list, and the pieces of
// flattening per-parameter state to "param.<index>.<field>" keys and back.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/model.hpp"
#include "tessera/optimizer.hpp"

namespace tessera_plugins {

template <class TorchOptim>
class TorchOptimizer : public tessera::Optimizer {
 public:
  void step() override { optimizer_->step(); }
  void zero_grad() override { optimizer_->zero_grad(/*set_to_none=*/true); }
  double base_lr() const override { return base_lr_; }
  void set_lr(double lr) override {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  }
  std::vector<at::Tensor> parameters() const override { return params_; }

 protected:
  TorchOptimizer(std::shared_ptr<tessera::Model> model, double base_lr, std::string name)
      : model_(std::move(model)), base_lr_(base_lr), name_(std::move(name)) {}

  // Takes the built optimizer; parameters() follows its param-group order.
  void adopt(std::unique_ptr<TorchOptim> optimizer) {
    optimizer_ = std::move(optimizer);
    for (const auto& group : optimizer_->param_groups()) {
      params_.insert(params_.end(), group.params().begin(), group.params().end());
    }
  }

  // The LibTorch state of parameter `index`, or null before its first step.
  template <class ParamState>
  const ParamState* state_of(std::size_t index) const {
    const auto& state = optimizer_->state();
    auto it = state.find(params_[index].unsafeGetTensorImpl());
    return it == state.end() ? nullptr : static_cast<const ParamState*>(it->second.get());
  }
  void set_state(std::size_t index, std::unique_ptr<torch::optim::OptimizerParamState> state) {
    optimizer_->state()[params_[index].unsafeGetTensorImpl()] = std::move(state);
  }
  void clear_state() { optimizer_->state().clear(); }

  static std::string state_key(std::size_t index, const char* field) {
    return "param." + std::to_string(index) + "." + field;
  }
  const at::Tensor& saved(const tessera::StateDict& state, const std::string& key) const {
    auto it = state.find(key);
    if (it == state.end()) throw tessera::Error(name_ + " state: missing " + key);
    return it->second;
  }
  // A copy of a saved per-parameter tensor, placed like parameter `index`.
  at::Tensor restore_like(const at::Tensor& saved, std::size_t index, const std::string& key) const {
    const at::Tensor& param = params_[index];
    if (saved.sizes() != param.sizes()) {
      throw tessera::Error(name_ + " state: " + key + " has shape " + c10::str(saved.sizes()) +
                           " but the parameter has " + c10::str(param.sizes()));
    }
    return saved.to(param.options(), /*non_blocking=*/false, /*copy=*/true);
  }
  // Every key must have been used: anything else belongs to another optimizer or model.
  void check_all_used(const tessera::StateDict& state, std::size_t used, const char* what) const {
    if (used != state.size()) {
      throw tessera::Error(name_ + " state: " + std::to_string(state.size() - used) + " keys are not " + what +
                           " of this optimizer's " + std::to_string(params_.size()) + " parameters");
    }
  }

  std::shared_ptr<tessera::Model> model_;  // keeps the parameters alive
  double base_lr_;
  std::string name_;
  std::unique_ptr<TorchOptim> optimizer_;
  std::vector<at::Tensor> params_;  // every optimised parameter, in param-group order
};

}  // namespace tessera_plugins
