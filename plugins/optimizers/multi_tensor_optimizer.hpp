// What adamw and sgd share (header only, included by relative path): parameter groups, the
// per-parameter state as tensors by field, the state dict flattened to "param.<index>.<field>"
// keys and restored exactly, state_bytes() without copies, and the choice of implementation:
//
//   fused    one kernel per device and dtype of a group (at::_fused_adamw_, at::_fused_sgd_),
//   foreach  the same arithmetic as `loop`, each op applied to all tensors at once (_foreach_*),
//   loop     one parameter at a time (torch::optim's arithmetic, the reference).
//
// `auto` (the default) picks fused where LibTorch has the kernel (CPU and CUDA, floating
// dtypes), else foreach. No implementation reads a device value on the host: step counts are
// host integers (fused also keeps them as device scalars, as its kernel wants). Fused AdamW can
// skip a step on the device (Optimizer::can_skip_on_device); its device counts are then the true
// ones, read back only when a state dict is taken.
#pragma once

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"

namespace tessera_plugins {

enum class OptimizerImplementation { fused, foreach, loop };

inline const char* kImplementationDoc =
    "auto (fused where LibTorch has the kernel for the device and dtype, else foreach), fused, foreach or loop";

inline bool is_implementation_name(const std::string& name) {
  return name == "auto" || name == "fused" || name == "foreach" || name == "loop";
}

// The implementation `name` means for parameters like `sample`.
inline OptimizerImplementation resolve_implementation(const std::string& name, const at::Tensor& sample) {
  if (name == "loop") return OptimizerImplementation::loop;
  if (name == "foreach") return OptimizerImplementation::foreach;
  const bool fused_kernel = (sample.device().is_cpu() || sample.device().is_cuda()) &&
                            at::isFloatingType(sample.scalar_type());
  if (name == "fused" && !fused_kernel) {
    throw tessera::Error("optimizer: implementation fused has no kernel for " +
                         std::string(c10::toString(sample.scalar_type())) + " on " + sample.device().str() +
                         "; use foreach or auto");
  }
  return fused_kernel ? OptimizerImplementation::fused : OptimizerImplementation::foreach;
}

// The indices of `params` in `indices` split by the parameter's (device, dtype), the splits in
// the order their first member appears and each keeping the order of `indices`.
inline std::vector<std::vector<std::size_t>> split_by_device_and_dtype(const std::vector<at::Tensor>& params,
                                                                       const std::vector<std::size_t>& indices) {
  std::vector<std::vector<std::size_t>> splits;
  std::vector<std::pair<c10::Device, at::ScalarType>> kinds;
  for (std::size_t i : indices) {
    const std::pair<c10::Device, at::ScalarType> kind{params[i].device(), params[i].scalar_type()};
    std::size_t k = 0;
    while (k < kinds.size() && kinds[k] != kind) ++k;
    if (k == kinds.size()) {
      kinds.push_back(kind);
      splits.emplace_back();
    }
    splits[k].push_back(i);
  }
  return splits;
}

// AdamW's update (torch::optim::AdamW's arithmetic) over many tensors at once: decoupled weight
// decay, the moments, bias corrections by each tensor's own step. Shared by optimizer/adamw's
// foreach implementation and optimizer/muon's AdamW parameters.
struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
inline void adamw_foreach_update(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                 std::vector<at::Tensor>& exp_avgs, std::vector<at::Tensor>& exp_avg_sqs,
                                 const std::vector<std::int64_t>& steps, const AdamWHyper& h) {
  std::vector<c10::Scalar> root_bc2, step_sizes;
  for (const std::int64_t step : steps) {
    const auto t = static_cast<double>(step);
    root_bc2.emplace_back(std::sqrt(1.0 - std::pow(h.beta2, t)));
    step_sizes.emplace_back(-h.lr / (1.0 - std::pow(h.beta1, t)));
  }
  if (h.weight_decay != 0) at::_foreach_mul_(params, 1.0 - h.lr * h.weight_decay);
  at::_foreach_mul_(exp_avgs, h.beta1);
  at::_foreach_add_(exp_avgs, grads, 1.0 - h.beta1);
  at::_foreach_mul_(exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - h.beta2);
  std::vector<at::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denoms, root_bc2);
  at::_foreach_add_(denoms, h.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denoms, step_sizes);
}

// One group of parameters with the same hyperparameters (AdamW: decayed or not).
struct ParamGroup {
  std::vector<std::size_t> members;  // indices into the optimizer's parameters
  double weight_decay = 0;
};

// One parameter's state: a host step count and the tensors of per-element fields.
struct ParamState {
  std::int64_t step = 0;           // 0: never stepped (no state); steps skipped on the device count
                                   // here too (device_step is the true count where defined)
  std::vector<at::Tensor> fields;  // per-element fields, in fields_of(its index) order
  at::Tensor device_step;          // fused AdamW: the step as a float scalar on the device
};

class MultiTensorOptimizer : public tessera::Optimizer {
 public:
  double base_lr() const override { return base_lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::vector<at::Tensor> parameters() const override { return params_; }
  void zero_grad() override {
    for (const auto& p : params_) p.mutable_grad() = at::Tensor();
  }

  std::int64_t state_bytes() const override {
    std::int64_t n = 0;
    for (const ParamState& s : state_) {
      for (const auto& t : s.fields) n += static_cast<std::int64_t>(t.nbytes());
      if (s.device_step.defined()) n += static_cast<std::int64_t>(s.device_step.nbytes());
    }
    return n;
  }

  // Host copies, so a later step cannot change a state dict already handed to a checkpoint.
  // Parameters never stepped have no keys; the step is saved when the optimizer counts steps.
  tessera::StateDict state_dict() const override {
    tessera::StateDict state;
    const std::vector<std::int64_t> steps = step_counts();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const ParamState& s = state_[i];
      if (steps[i] == 0) continue;  // never stepped, or its only steps were skipped on the device
      const std::vector<std::string> fields = fields_of(i);
      if (saves_step_of(i)) state[key(i, "step")] = at::scalar_tensor(steps[i], at::kLong);
      for (std::size_t f = 0; f < fields.size(); ++f) {
        state[key(i, fields[f])] = s.fields[f].to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      }
    }
    return state;
  }

  void load_state_dict(const tessera::StateDict& state) override {
    std::size_t used = 0;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      ParamState& s = state_[i];
      s = ParamState{};
      const std::vector<std::string> fields = fields_of(i);
      const bool steps = saves_step_of(i);
      if (!steps && fields.empty()) continue;  // stateless (sgd without momentum)
      const std::string first = steps ? key(i, "step") : key(i, fields.front());
      if (state.count(first) == 0) continue;  // never stepped when saved
      s.step = steps ? saved(state, first).item<std::int64_t>() : 1;
      used += steps ? 1 : 0;
      for (const std::string& field : fields) {
        s.fields.push_back(restore_like(saved(state, key(i, field)), i, key(i, field)));
        ++used;
      }
    }
    // Every key must have been used: anything else belongs to another optimizer or model.
    if (used != state.size()) {
      throw tessera::Error(name_ + " state: " + std::to_string(state.size() - used) +
                           " keys are not state of this optimizer's " + std::to_string(params_.size()) + " parameters");
    }
  }

 protected:
  MultiTensorOptimizer(std::shared_ptr<tessera::Model> model, double base_lr, std::string implementation,
                       std::string name)
      : model_(std::move(model)), base_lr_(base_lr), lr_(base_lr), implementation_(std::move(implementation)),
        name_(std::move(name)) {}

  // Parameter i's per-element state fields, and whether its step count is state too (Muon's
  // matrices and its AdamW parameters keep different state).
  virtual std::vector<std::string> fields_of(std::size_t i) const = 0;
  virtual bool saves_step_of(std::size_t i) const = 0;

  // Sets the parameters (group by group) and sizes the state.
  void adopt(std::vector<std::vector<at::Tensor>> groups, const std::vector<double>& weight_decays) {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].empty()) continue;
      ParamGroup group;
      group.weight_decay = weight_decays[g];
      for (auto& p : groups[g]) {
        group.members.push_back(params_.size());
        params_.push_back(std::move(p));
      }
      groups_.push_back(std::move(group));
    }
    state_.resize(params_.size());
  }

  // The implementation for this step (parameters may have moved to a shard since construction).
  OptimizerImplementation implementation() const {
    return resolve_implementation(implementation_, params_.front());
  }

  // The group's parameters that have a gradient this step, with their state created if new
  // (per-element fields zero, shaped like the parameter as it is now: whole, or its shard).
  std::vector<std::size_t> active(const ParamGroup& group) {
    std::vector<std::size_t> out;
    for (std::size_t i : group.members) {
      if (!params_[i].grad().defined()) continue;
      ParamState& s = state_[i];
      if (s.fields.empty()) {
        const std::size_t n_fields = fields_of(i).size();
        for (std::size_t f = 0; f < n_fields; ++f) s.fields.push_back(at::zeros_like(params_[i]));
      }
      out.push_back(i);
    }
    return out;
  }

  // `indices` in runs of one device and dtype, each in its original order: a fused kernel takes
  // one of each per call on CUDA (torch.optim groups its tensors the same way before calling it).
  std::vector<std::vector<std::size_t>> by_device_and_dtype(const std::vector<std::size_t>& indices) const {
    return split_by_device_and_dtype(params_, indices);
  }

  std::vector<at::Tensor> gather(const std::vector<std::size_t>& indices, std::size_t field) const {
    std::vector<at::Tensor> out;
    out.reserve(indices.size());
    for (std::size_t i : indices) out.push_back(state_[i].fields[field]);
    return out;
  }
  // The parameters as the update writes them: detached, so in-place ops bypass autograd.
  std::vector<at::Tensor> params_of(const std::vector<std::size_t>& indices) const {
    std::vector<at::Tensor> out;
    out.reserve(indices.size());
    for (std::size_t i : indices) out.push_back(params_[i].detach());
    return out;
  }
  std::vector<at::Tensor> grads_of(const std::vector<std::size_t>& indices) const {
    std::vector<at::Tensor> out;
    out.reserve(indices.size());
    for (std::size_t i : indices) out.push_back(params_[i].grad());
    return out;
  }

  // The trainable parameters of the model, each once; a model with none is a config error.
  // LibTorch's Module::parameters() lists a parameter once per name it is registered under (a
  // block shared by two layers, ALBERT-style): kept twice, it would get two states and two
  // updates a step, and count twice in the gradient norm. PyTorch's optimizers see it once.
  std::vector<at::Tensor> trainable_parameters() const {
    std::vector<at::Tensor> trainable;
    std::unordered_set<const void*> seen;
    for (const at::Tensor& p : model_->parameters()) {
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) trainable.push_back(p);
    }
    if (trainable.empty()) throw tessera::ConfigError("the model has no trainable parameters", "model");
    return trainable;
  }

  std::shared_ptr<tessera::Model> model_;  // keeps the parameters alive
  double base_lr_, lr_;
  std::string implementation_;
  std::string name_;
  std::vector<at::Tensor> params_;  // every optimised parameter, group by group
  std::vector<ParamGroup> groups_;
  std::vector<ParamState> state_;   // per parameter

 private:
  // Each parameter's step count: the device's where fused AdamW keeps one (read in one copy: a
  // step skipped there did not count, which the host count cannot know), else the host's.
  std::vector<std::int64_t> step_counts() const {
    std::vector<std::int64_t> steps;
    std::vector<at::Tensor> on_device;
    for (const ParamState& s : state_) {
      steps.push_back(s.step);
      if (s.device_step.defined()) on_device.push_back(s.device_step.reshape({1}));
    }
    if (on_device.empty()) return steps;
    const at::Tensor counts = at::cat(on_device).to(at::kCPU).to(at::kLong);
    std::size_t next = 0;
    for (std::size_t i = 0; i < state_.size(); ++i) {
      if (state_[i].device_step.defined()) steps[i] = counts[static_cast<std::int64_t>(next++)].item<std::int64_t>();
    }
    return steps;
  }

  static std::string key(std::size_t index, const std::string& field) {
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
