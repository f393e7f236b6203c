// Optimizer `sgd`: stochastic gradient descent with optional (Nesterov) momentum and L2 weight
// decay, fused, foreach or loop (see ../multi_tensor_optimizer.hpp).
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_fused_sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "../multi_tensor_optimizer.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera_plugins::OptimizerImplementation;

struct SgdConfig {
  std::shared_ptr<tessera::Model> model;
  double lr = 1e-3;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  std::string implementation = "auto";

  static void declare(tessera::ConfigFields<SgdConfig>& f) {
    using C = SgdConfig;
    f.field("model", &C::model, "the model whose parameters are optimised");
    f.field("lr", &C::lr, "base learning rate (the scheduler multiplies it)").greater_than(0);
    f.field("momentum", &C::momentum, "momentum factor (0 = plain SGD)").at_least(0);
    f.field("nesterov", &C::nesterov, "use Nesterov momentum (needs momentum > 0)");
    f.field("weight_decay", &C::weight_decay, "L2 penalty added to the gradient").at_least(0);
    f.field("implementation", &C::implementation, tessera_plugins::kImplementationDoc)
        .one_of({"auto", "fused", "foreach", "loop"});
    f.check([](const C& c) {
      if (c.nesterov && c.momentum <= 0) throw tessera::ConfigError("nesterov needs momentum > 0", "nesterov");
    });
  }
};

// Without momentum SGD has no state and its state dict is empty.
class SgdOptimizer final : public tessera_plugins::MultiTensorOptimizer {
 public:
  explicit SgdOptimizer(const SgdConfig& config)
      : MultiTensorOptimizer(config.model, config.lr, config.implementation, "optimizer/sgd"),
        momentum_(config.momentum),
        nesterov_(config.nesterov) {
    adopt({trainable_parameters()}, {config.weight_decay});
  }

  void step() override {
    const OptimizerImplementation how = implementation();
    for (const auto& group : groups_) {
      const std::vector<std::size_t> members = active(group);
      if (members.empty()) continue;
      // A momentum buffer starts as the parameter's first gradient (torch's rule), decided per
      // parameter: one that gets its first gradient later (unused so far, or without a buffer in
      // the checkpoint it resumed from) must not reset the others' buffers.
      std::vector<std::size_t> first_steps, later_steps;
      for (std::size_t i : members) (state_[i].step == 0 ? first_steps : later_steps).push_back(i);
      for (std::size_t i : members) state_[i].step += 1;
      for (const bool first : {true, false}) {
        const std::vector<std::size_t>& some = first ? first_steps : later_steps;
        if (some.empty()) continue;
        switch (how) {
          case OptimizerImplementation::fused:
            for (const auto& same_kind : by_device_and_dtype(some)) fused_step(group, same_kind, first);
            break;
          case OptimizerImplementation::foreach: foreach_step(group, some, first); break;
          case OptimizerImplementation::loop: loop_step(group, some, first); break;
        }
      }
    }
  }

 protected:
  std::vector<std::string> fields_of(std::size_t) const override {
    if (momentum_ == 0) return {};
    return {"momentum_buffer"};
  }
  bool saves_step_of(std::size_t) const override { return false; }

 private:
  // torch::optim::SGD's arithmetic, one parameter at a time: the reference.
  void loop_step(const tessera_plugins::ParamGroup& group, const std::vector<std::size_t>& members, bool first) {
    for (std::size_t i : members) {
      at::Tensor p = params_[i].detach();
      at::Tensor d_p = params_[i].grad();
      if (group.weight_decay != 0) d_p = d_p.add(p, group.weight_decay);
      if (momentum_ != 0) {
        at::Tensor& buf = state_[i].fields[0];
        if (first) {
          buf.copy_(d_p);
        } else {
          buf.mul_(momentum_).add_(d_p);
        }
        d_p = nesterov_ ? d_p.add(buf, momentum_) : buf;
      }
      p.add_(d_p, -lr_);
    }
  }

  // The loop's arithmetic, every op over all of the group's tensors at once.
  void foreach_step(const tessera_plugins::ParamGroup& group, const std::vector<std::size_t>& members, bool first) {
    std::vector<at::Tensor> params = params_of(members);
    std::vector<at::Tensor> d_p = grads_of(members);
    if (group.weight_decay != 0) d_p = at::_foreach_add(d_p, params, group.weight_decay);
    if (momentum_ != 0) {
      std::vector<at::Tensor> bufs = gather(members, 0);
      if (first) {
        for (std::size_t k = 0; k < bufs.size(); ++k) bufs[k].copy_(d_p[k]);
      } else {
        at::_foreach_mul_(bufs, momentum_);
        at::_foreach_add_(bufs, d_p);
      }
      d_p = nesterov_ ? at::_foreach_add(d_p, bufs, momentum_) : bufs;
    }
    at::_foreach_add_(params, d_p, -lr_);
  }

  void fused_step(const tessera_plugins::ParamGroup& group, const std::vector<std::size_t>& members, bool first) {
    std::vector<at::Tensor> params = params_of(members);
    const std::vector<at::Tensor> bufs = momentum_ != 0 ? gather(members, 0) : std::vector<at::Tensor>{};
    at::_fused_sgd_(params, grads_of(members), bufs, group.weight_decay, momentum_, lr_, /*dampening=*/0.0,
                    nesterov_, /*maximize=*/false,
                    /*is_first_step=*/first && momentum_ != 0);  // only momentum buffers have a first step
  }

  double momentum_;
  bool nesterov_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Optimizer, SgdConfig>(
      "sgd", "stochastic gradient descent with optional (Nesterov) momentum, fused or multi-tensor",
      [](const SgdConfig& c) { return std::make_shared<SgdOptimizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("optimizer_sgd", "0.1.0", register_components)
