// Optimizer `sgd`: torch::optim::SGD over a model's parameters, with optional (Nesterov)
// momentum and L2 weight decay.
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "../torch_optimizer.hpp"
#include "tessera/plugin.hpp"

namespace {

struct SgdConfig {
  std::shared_ptr<tessera::Model> model;
  double lr = 1e-3;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;

  static void declare(tessera::ConfigFields<SgdConfig>& f) {
    using C = SgdConfig;
    f.field("model", &C::model, "the model whose parameters are optimised");
    f.field("lr", &C::lr, "base learning rate (the scheduler multiplies it)").greater_than(0);
    f.field("momentum", &C::momentum, "momentum factor (0 = plain SGD)").at_least(0);
    f.field("nesterov", &C::nesterov, "use Nesterov momentum (needs momentum > 0)");
    f.field("weight_decay", &C::weight_decay, "L2 penalty added to the gradient").at_least(0);
    f.check([](const C& c) {
      if (c.nesterov && c.momentum <= 0) throw tessera::ConfigError("nesterov needs momentum > 0", "nesterov");
    });
  }
};

using SgdBase = tessera_plugins::TorchOptimizer<torch::optim::SGD, torch::optim::SGDParamState>;

// Without momentum SGD has no state and its state dict is empty.
class SgdOptimizer final : public SgdBase {
 public:
  explicit SgdOptimizer(const SgdConfig& config) : SgdBase(config.model, config.lr, "optimizer/sgd") {
    auto options = torch::optim::SGDOptions(base_lr_)
                       .momentum(config.momentum)
                       .nesterov(config.nesterov)
                       .weight_decay(config.weight_decay);
    adopt(std::make_unique<torch::optim::SGD>(trainable_parameters(), options));
  }

 protected:
  std::vector<tessera_plugins::StateField> state_fields() const override { return {{"momentum_buffer", true}}; }
  std::vector<at::Tensor> save_fields(const torch::optim::SGDParamState& s) const override {
    return {s.momentum_buffer()};
  }
  std::unique_ptr<torch::optim::SGDParamState> load_fields(const std::vector<at::Tensor>& values) const override {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(values[0]);
    return s;
  }
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Optimizer, SgdConfig>(
      "sgd", "stochastic gradient descent with optional (Nesterov) momentum",
      [](const SgdConfig& c) { return std::make_shared<SgdOptimizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("optimizer_sgd", "0.1.0", register_components)
