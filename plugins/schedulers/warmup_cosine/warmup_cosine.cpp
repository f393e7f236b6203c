// Scheduler `warmup_cosine`: linear warmup, then a half cosine from the base lr down to
// min_lr_ratio * base lr at total_steps, then flat.
#include <cmath>
#include <cstdint>
#include <memory>

#include "../warmup.hpp"
#include "tessera/plugin.hpp"
#include "tessera/components/scheduler.hpp"

namespace {

struct WarmupCosineConfig : tessera::schedulers::WarmupDecayConfig {
  WarmupCosineConfig() : WarmupDecayConfig(/*default_min_lr_ratio=*/0.1) {}
  static void declare(tessera::ConfigFields<WarmupCosineConfig>& f) { tessera::schedulers::declare_warmup_decay(f); }
};

class WarmupCosineScheduler final : public tessera::Scheduler {
 public:
  explicit WarmupCosineScheduler(const WarmupCosineConfig& config) : schedule_(config) {}

  double lr_factor(std::int64_t step) const override {
    return schedule_.factor(step, tessera::schedulers::cosine_shape);
  }
  double lr(std::int64_t step, double base_lr) const override {
    return schedule_.lr(step, base_lr, tessera::schedulers::cosine_shape);
  }

 private:
  tessera::schedulers::WarmupDecay schedule_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Scheduler, WarmupCosineConfig>(
      "warmup_cosine", "linear warmup, then cosine decay to min_lr_ratio at total_steps",
      [](const WarmupCosineConfig& c) { return std::make_shared<WarmupCosineScheduler>(c); });
}

}  // namespace

TESSERA_PLUGIN("scheduler_warmup_cosine", "0.1.0", register_components)
