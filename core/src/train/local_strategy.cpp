#include "tessera/core/train/local_strategy.hpp"

#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <string>
#include <utility>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"

namespace tessera::core {
namespace {

class LocalStrategy final : public ParallelStrategy {
 public:
  void setup(Model& model, Optimizer& optimizer, Communicator& comm) override {
    if (comm.world_size() > 1) {
      throw Error("trainer: a run of " + std::to_string(comm.world_size()) +
                  " ranks needs a parallel strategy (components.parallel)");
    }
    parameters_ = optimizer.parameters();
    frozen_bytes_ = frozen_parameter_bytes(model, parameters_);
  }
  void begin_micro_batch(std::int64_t, std::int64_t) override {}
  void finish_gradients() override {}

  std::vector<at::Tensor> gradients() override {
    std::vector<at::Tensor> grads;
    for (const auto& p : parameters_) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    return grads;
  }

  // The gradients this rank counts in the norm (all, unless count_in_grad_norm left some out).
  std::vector<at::Tensor> counted_gradients() const {
    std::vector<at::Tensor> grads;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor& p = parameters_[i];
      if (p.grad().defined() && (counted_.empty() || counted_[i])) grads.push_back(p.grad());
    }
    return grads;
  }

  at::Tensor grad_norm_squared_share() override { return grad_norm().square(); }

  void count_in_grad_norm(const std::vector<bool>& counted) override {
    if (counted.size() != parameters_.size()) {
      throw Error("count_in_grad_norm: " + std::to_string(counted.size()) + " flags for " +
                  std::to_string(parameters_.size()) + " parameters");
    }
    counted_ = counted;
  }

  // Alone: no collective, the loss is already the whole step's, the norm is taken directly (the
  // root of a square would not always give it back to the last bit). With tensor-parallel peers
  // (one data-parallel rank, tp > 1), the shares are summed over them.
  LossAndGradNorm reduce_loss_and_grad_norm(Communicator& comm, const at::Tensor& loss_sum) override {
    if (comm.world_size() > 1) return ParallelStrategy::reduce_loss_and_grad_norm(comm, loss_sum);
    return {loss_sum, grad_norm().to(loss_sum.device())};
  }

  void optimizer_step(Optimizer& optimizer) override { optimizer.step(); }
  void zero_grad(Optimizer& optimizer) override { optimizer.zero_grad(); }

  ParallelMemory memory() const override {
    ParallelMemory held;
    held.parameters = frozen_bytes_;
    for (const auto& p : parameters_) {
      held.parameters += static_cast<std::int64_t>(p.nbytes());
      if (p.grad().defined()) held.gradients += static_cast<std::int64_t>(p.grad().nbytes());
    }
    return held;
  }

  StateDict full_parameters(Model& model, std::int64_t) override {
    StateDict out;
    for (const auto& item : model.named_parameters()) {
      out[item.key()] = item.value().detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    return out;
  }

  void load_full_parameters(Model& model, const StateDict& state) override {
    c10::NoGradGuard no_grad;
    for (auto& item : model.named_parameters()) {
      auto it = state.find(item.key());
      if (it == state.end()) throw Error("no saved value for parameter " + item.key());
      if (it->second.sizes() != item.value().sizes()) {
        throw Error("saved " + item.key() + " has shape " + c10::str(it->second.sizes()) + ", the model's has " +
                    c10::str(item.value().sizes()));
      }
      item.value().copy_(it->second);
    }
  }

  bool shards_optimizer_state() const override { return false; }

  std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges() const override {
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (const auto& p : parameters_) ranges.emplace_back(0, p.numel());
    return ranges;
  }

  void with_owned_parameters(const std::function<void()>& fn) override { fn(); }

 private:
  // The L2 norm over all gradients as a device tensor (no host synchronisation).
  at::Tensor grad_norm() {
    const std::vector<at::Tensor> grads = counted_gradients();
    if (grads.empty()) {
      // No gradient this step: a zero on the parameters' device, not a host tensor to copy over.
      const auto device = parameters_.empty() ? at::Device(at::kCPU) : parameters_.front().device();
      return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    }
    std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
    for (auto& n : norms) n = n.to(at::kFloat);
    return at::stack(norms).norm();
  }

  std::vector<at::Tensor> parameters_;
  std::int64_t frozen_bytes_ = 0;  // the model's parameters the optimizer does not update
  std::vector<bool> counted_;  // empty: every parameter
};

}  // namespace

std::shared_ptr<ParallelStrategy> make_local_strategy() { return std::make_shared<LocalStrategy>(); }

bool is_local_strategy(const ParallelStrategy& strategy) { return dynamic_cast<const LocalStrategy*>(&strategy); }

}  // namespace tessera::core
