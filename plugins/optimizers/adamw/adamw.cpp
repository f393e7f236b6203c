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

struct AdamWConfig {
  std::shared_ptr<tessera::Model> model;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decay_norm_and_bias = false;

  static void declare(tessera::ConfigFields<AdamWConfig>& f) {
    using C = AdamWConfig;
    f.field("model", &C::model, "the model whose parameters are optimised");
    f.field("lr", &C::lr, "base learning rate (the scheduler multiplies it)").greater_than(0);
    f.field("beta1", &C::beta1, "decay of the first-moment average").at_least(0).less_than(1);
    f.field("beta2", &C::beta2, "decay of the second-moment average").at_least(0).less_than(1);
    f.field("eps", &C::eps, "added to the denominator for stability").greater_than(0);
    f.field("weight_decay", &C::weight_decay, "decoupled weight decay").at_least(0);
    f.field("decay_norm_and_bias", &C::decay_norm_and_bias, "also decay tensors with fewer than 2 dimensions");
  }
};

using AdamWBase = tessera_plugins::TorchOptimizer<torch::optim::AdamW, torch::optim::AdamWParamState>;

class AdamWOptimizer final : public AdamWBase {
 public:
  explicit AdamWOptimizer(const AdamWConfig& config) : AdamWBase(config.model, config.lr, "optimizer/adamw") {
    auto options = torch::optim::AdamWOptions(base_lr_)
                       .betas(std::make_tuple(config.beta1, config.beta2))
                       .eps(config.eps)
                       .weight_decay(config.weight_decay);
    std::vector<at::Tensor> decayed, not_decayed;
    for (const at::Tensor& p : trainable_parameters()) {
      (config.decay_norm_and_bias || p.dim() >= 2 ? decayed : not_decayed).push_back(p);
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (!decayed.empty()) groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(options));
    if (!not_decayed.empty()) {
      auto no_decay = options;
      no_decay.weight_decay(0.0);
      groups.emplace_back(not_decayed, std::make_unique<torch::optim::AdamWOptions>(no_decay));
    }
    adopt(std::make_unique<torch::optim::AdamW>(groups, options));
  }

 protected:
  std::vector<tessera_plugins::StateField> state_fields() const override {
    return {{"step", false}, {"exp_avg", true}, {"exp_avg_sq", true}};
  }
  std::vector<at::Tensor> save_fields(const torch::optim::AdamWParamState& s) const override {
    return {at::scalar_tensor(s.step(), at::kLong), s.exp_avg(), s.exp_avg_sq()};
  }
  std::unique_ptr<torch::optim::AdamWParamState> load_fields(const std::vector<at::Tensor>& values) const override {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(values[0].item<std::int64_t>());
    s->exp_avg(values[1]);
    s->exp_avg_sq(values[2]);
    return s;
  }
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Optimizer, AdamWConfig>(
      "adamw", "AdamW with decoupled weight decay (biases and norms undecayed by default)",
      [](const AdamWConfig& c) { return std::make_shared<AdamWOptimizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("optimizer_adamw", "0.1.0", register_components)
