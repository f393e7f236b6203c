// Optimizer `sgd`: torch::optim::SGD over a model's parameters, with optional (Nesterov)
// momentum and L2 weight decay.
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "../torch_optimizer.hpp"
#include "tessera/plugin.hpp"

namespace {

class SgdOptimizer final : public tessera_plugins::TorchOptimizer<torch::optim::SGD> {
 public:
  explicit SgdOptimizer(const tessera::ComponentConfig& config)
      : TorchOptimizer(config.component<tessera::Model>("model"), config.number("lr"), "optimizer/sgd") {
    const double momentum = config.number("momentum");
    const bool nesterov = config.boolean("nesterov");
    if (nesterov && momentum <= 0) {
      throw tessera::ConfigError("nesterov needs momentum > 0", "nesterov");
    }
    std::vector<at::Tensor> trainable;
    for (const at::Tensor& p : model_->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    if (trainable.empty()) {
      throw tessera::ConfigError("the model has no trainable parameters", "model");
    }
    auto options =
        torch::optim::SGDOptions(base_lr_).momentum(momentum).nesterov(nesterov).weight_decay(
            config.number("weight_decay"));
    adopt(std::make_unique<torch::optim::SGD>(trainable, options));
  }

  // Host copies, so a later step cannot change a state dict already handed to a checkpoint, and
  // saving never holds a second copy of the state on the device.
  // Without momentum SGD has no state and the dict is empty.
  tessera::StateDict state_dict() const override {
    tessera::StateDict state;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (const auto* s = state_of<torch::optim::SGDParamState>(i)) {
        state[state_key(i, "momentum_buffer")] = s->momentum_buffer().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      }
    }
    return state;
  }

  void load_state_dict(const tessera::StateDict& state) override {
    std::size_t used = 0;
    clear_state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::string key = state_key(i, "momentum_buffer");
      if (state.count(key) == 0) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(restore_like(saved(state, key), i, key));
      set_state(i, std::move(s));
      ++used;
    }
    check_all_used(state, used, "momentum buffers");
  }
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
