// Scheduler `linear`: linear warmup, then a straight line from the base lr down to
// min_lr_ratio * base lr at total_steps, then flat.
#include <cstdint>
#include <memory>

#include "../warmup.hpp"
#include "tessera/plugin.hpp"
#include "tessera/components/scheduler.hpp"

namespace {

struct LinearConfig : tessera::schedulers::WarmupDecayConfig {
  LinearConfig() : WarmupDecayConfig(/*default_min_lr_ratio=*/0.0) {}
  static void declare(tessera::ConfigFields<LinearConfig>& f) { tessera::schedulers::declare_warmup_decay(f); }
};

class LinearScheduler final : public tessera::Scheduler {
 public:
  explicit LinearScheduler(const LinearConfig& config) : schedule_(config) {}

  double lr_factor(std::int64_t step) const override {
    return schedule_.factor(step, tessera::schedulers::linear_shape);
  }
  double lr(std::int64_t step, double base_lr) const override {
    return schedule_.lr(step, base_lr, tessera::schedulers::linear_shape);
  }

 private:
  tessera::schedulers::WarmupDecay schedule_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Scheduler, LinearConfig>(
      "linear", "linear warmup, then linear decay to min_lr_ratio at total_steps",
      [](const LinearConfig& c) { return std::make_shared<LinearScheduler>(c); });
}

}  // namespace

TESSERA_PLUGIN("scheduler_linear", "0.1.0", register_components)
