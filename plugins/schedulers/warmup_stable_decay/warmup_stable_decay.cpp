// Scheduler `warmup_stable_decay` (WSD): linear warmup, the base lr held through most of
// training, then a decay over the last `decay_ratio` of total_steps (linear, cosine or 1-sqrt)
// down to the floor. The stable phase can be continued from any checkpoint before the decay.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "../warmup.hpp"
#include "tessera/plugin.hpp"
#include "tessera/components/scheduler.hpp"

namespace {

struct WsdConfig : tessera::schedulers::WarmupDecayConfig {
  double decay_ratio = 0.2;
  std::string decay_shape = "1-sqrt";

  WsdConfig() : WarmupDecayConfig(/*default_min_lr_ratio=*/0.0) {}

  std::int64_t decay_start() const {
    return total_steps - static_cast<std::int64_t>(std::llround(decay_ratio * static_cast<double>(total_steps)));
  }

  static void declare(tessera::ConfigFields<WsdConfig>& f) {
    tessera::schedulers::declare_warmup_decay(f);
    f.field("decay_ratio", &WsdConfig::decay_ratio, "the final fraction of total_steps that decays").at_least(0).at_most(1);
    f.field("decay_shape", &WsdConfig::decay_shape,
            "linear, cosine, or 1-sqrt (1 - sqrt(progress): a quick drop that flattens)")
        .one_of({"linear", "cosine", "1-sqrt"});
    f.check([](const WsdConfig& c) {
      if (c.decay_start() < c.resolved_warmup_steps()) {
        throw tessera::ConfigError("warmup and decay overlap: warmup ends at step " +
                                       std::to_string(c.resolved_warmup_steps()) + ", decay starts at step " +
                                       std::to_string(c.decay_start()),
                                   "decay_ratio");
      }
    });
  }
};

class WsdScheduler final : public tessera::Scheduler {
 public:
  explicit WsdScheduler(const WsdConfig& c)
      : schedule_(c),
        decay_start_(c.decay_start()),
        shape_(c.decay_shape == "linear"   ? tessera::schedulers::linear_shape
               : c.decay_shape == "cosine" ? tessera::schedulers::cosine_shape
                                           : tessera::schedulers::one_minus_sqrt_shape) {}

  double lr_factor(std::int64_t step) const override { return schedule_.factor(step, shape_, decay_start_); }
  double lr(std::int64_t step, double base_lr) const override { return schedule_.lr(step, base_lr, shape_, decay_start_); }

 private:
  tessera::schedulers::WarmupDecay schedule_;
  std::int64_t decay_start_;
  double (*shape_)(double);
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Scheduler, WsdConfig>(
      "warmup_stable_decay", "linear warmup, constant lr, then a linear/cosine/1-sqrt decay over the last decay_ratio",
      [](const WsdConfig& c) { return std::make_shared<WsdScheduler>(c); });
}

}  // namespace

TESSERA_PLUGIN("scheduler_warmup_stable_decay", "0.1.0", register_components)
