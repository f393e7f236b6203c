// Optimizer `adamw`: torch::optim::AdamW over a model's parameters. By default biases and norm
// weights (tensors with fewer than 2 dimensions) are not decayed, as in GPT training.
#include <ATen/ops/scalar_tensor.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "../torch_optimizer.hpp"
#include "tessera/plugin.hpp"

namespace {

class AdamWOptimizer final : public tessera_plugins::TorchOptimizer<torch::optim::AdamW> {
 public:
  explicit AdamWOptimizer(const tessera::ComponentConfig& config)
      : TorchOptimizer(config.component<tessera::Model>("model"), config.number("lr"), "optimizer/adamw") {
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
    adopt(std::make_unique<torch::optim::AdamW>(groups, options));
  }

  // Host copies, so a later step cannot change a state dict already handed to a checkpoint, and
  // saving never holds a second copy of the state on the device.
  tessera::StateDict state_dict() const override {
    tessera::StateDict state;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto* s = state_of<torch::optim::AdamWParamState>(i);
      if (!s) continue;  // never stepped
      state[state_key(i, "step")] = at::scalar_tensor(s->step(), at::kLong);
      state[state_key(i, "exp_avg")] = s->exp_avg().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      state[state_key(i, "exp_avg_sq")] = s->exp_avg_sq().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    return state;
  }

  void load_state_dict(const tessera::StateDict& state) override {
    std::size_t used = 0;
    clear_state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::string step_key = state_key(i, "step");
      if (state.count(step_key) == 0) continue;  // never stepped when saved
      const std::string avg_key = state_key(i, "exp_avg"), sq_key = state_key(i, "exp_avg_sq");
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(saved(state, step_key).item<std::int64_t>());
      s->exp_avg(restore_like(saved(state, avg_key), i, avg_key));
      s->exp_avg_sq(restore_like(saved(state, sq_key), i, sq_key));
      set_state(i, std::move(s));
      used += 3;
    }
    check_all_used(state, used, "moments");
  }
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
