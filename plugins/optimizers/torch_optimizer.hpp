// What the optimizers wrapping a LibTorch optimizer share (header only, included by relative
// path): stepping, the learning rate on every param group, the parameter list, and their
// per-parameter state flattened to "param.<index>.<field>" keys and restored exactly. Each
// optimizer names its state fields and converts one parameter's state to and from them.
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

// One field of a parameter's optimizer state.
struct StateField {
  const char* name;
  bool per_element;  // shaped like the parameter (restored onto its device and dtype); else a 0-dim value
};

template <class TorchOptim, class ParamState>
class TorchOptimizer : public tessera::Optimizer {
 public:
  void step() override { optimizer_->step(); }
  void zero_grad() override { optimizer_->zero_grad(/*set_to_none=*/true); }
  double base_lr() const override { return base_lr_; }
  void set_lr(double lr) override {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  }
  std::vector<at::Tensor> parameters() const override { return params_; }

  // Host copies, so a later step cannot change a state dict already handed to a checkpoint, and
  // saving never holds a second copy of the state on the device. Parameters never stepped have
  // no keys.
  tessera::StateDict state_dict() const override {
    tessera::StateDict state;
    const std::vector<StateField> fields = state_fields();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto* s = state_of(i);
      if (!s) continue;
      const std::vector<at::Tensor> values = save_fields(*s);
      for (std::size_t f = 0; f < fields.size(); ++f) {
        state[state_key(i, fields[f].name)] = values[f].to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      }
    }
    return state;
  }

  void load_state_dict(const tessera::StateDict& state) override {
    const std::vector<StateField> fields = state_fields();
    std::size_t used = 0;
    optimizer_->state().clear();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (state.count(state_key(i, fields.front().name)) == 0) continue;  // never stepped when saved
      std::vector<at::Tensor> values;
      for (const StateField& field : fields) {
        const std::string key = state_key(i, field.name);
        const at::Tensor& value = saved(state, key);
        values.push_back(field.per_element ? restore_like(value, i, key) : value);
      }
      optimizer_->state()[params_[i].unsafeGetTensorImpl()] = load_fields(values);
      used += fields.size();
    }
    // Every key must have been used: anything else belongs to another optimizer or model.
    if (used != state.size()) {
      throw tessera::Error(name_ + " state: " + std::to_string(state.size() - used) +
                           " keys are not state of this optimizer's " + std::to_string(params_.size()) + " parameters");
    }
  }

 protected:
  TorchOptimizer(std::shared_ptr<tessera::Model> model, double base_lr, std::string name)
      : model_(std::move(model)), base_lr_(base_lr), name_(std::move(name)) {}

  // The fields of one parameter's state; the first is present whenever the parameter has state.
  virtual std::vector<StateField> state_fields() const = 0;
  // One parameter's state as tensors in state_fields() order, and back.
  virtual std::vector<at::Tensor> save_fields(const ParamState& state) const = 0;
  virtual std::unique_ptr<ParamState> load_fields(const std::vector<at::Tensor>& values) const = 0;

  // Takes the built optimizer; parameters() follows its param-group order.
  void adopt(std::unique_ptr<TorchOptim> optimizer) {
    optimizer_ = std::move(optimizer);
    for (const auto& group : optimizer_->param_groups()) {
      params_.insert(params_.end(), group.params().begin(), group.params().end());
    }
  }

  // The trainable parameters of the model; a model with none is a config error.
  std::vector<at::Tensor> trainable_parameters() const {
    std::vector<at::Tensor> trainable;
    for (const at::Tensor& p : model_->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    if (trainable.empty()) throw tessera::ConfigError("the model has no trainable parameters", "model");
    return trainable;
  }

  std::shared_ptr<tessera::Model> model_;  // keeps the parameters alive
  double base_lr_;
  std::string name_;
  std::unique_ptr<TorchOptim> optimizer_;
  std::vector<at::Tensor> params_;  // every optimised parameter, in param-group order

 private:
  // The LibTorch state of parameter `index`, or null before its first step.
  const ParamState* state_of(std::size_t index) const {
    const auto& state = optimizer_->state();
    auto it = state.find(params_[index].unsafeGetTensorImpl());
    return it == state.end() ? nullptr : static_cast<const ParamState*>(it->second.get());
  }
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
};

}  // namespace tessera_plugins
