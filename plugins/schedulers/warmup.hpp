// Linear warmup and warmup-then-decay, shared by the scheduler plugins (header only; each plugin
// includes it by relative path, so every .so carries its own copy): their declared config parts
// and the factors they compute.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "tessera/config_fields.hpp"
#include "tessera/error.hpp"

namespace tessera::schedulers {

struct WarmupConfig {
  std::int64_t warmup_steps = 0;
};

template <class Config>
void declare_warmup(ConfigFields<Config>& f) {
  f.field("warmup_steps", &WarmupConfig::warmup_steps, "steps of linear warmup from 1/warmup_steps up to 1").at_least(0);
}

// (step + 1) / warmup_steps during warmup, so the first step already has a non-zero lr.
inline double warmup_factor(std::int64_t step, std::int64_t warmup_steps) {
  if (step >= warmup_steps) return 1.0;
  return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
}

struct WarmupDecayConfig : WarmupConfig {
  std::int64_t total_steps = 1;
  double min_lr_ratio;
  // Each schedule has its own default floor (0 for linear, 0.1 for cosine).
  explicit WarmupDecayConfig(double default_min_lr_ratio) : min_lr_ratio(default_min_lr_ratio) {}
};

template <class Config>
void declare_warmup_decay(ConfigFields<Config>& f) {
  declare_warmup(f);
  f.field("total_steps", &WarmupDecayConfig::total_steps, "step at which the decay reaches min_lr_ratio")
      .required()
      .at_least(1);
  f.field("min_lr_ratio", &WarmupDecayConfig::min_lr_ratio, "final lr as a fraction of the base lr").at_least(0).at_most(1);
  f.check([](const Config& c) {
    if (c.warmup_steps > c.total_steps) {
      throw ConfigError("warmup_steps (" + std::to_string(c.warmup_steps) + ") must not exceed total_steps (" +
                            std::to_string(c.total_steps) + ")",
                        "warmup_steps");
    }
  });
}

// Warmup, then a decay from 1 down to min_lr_ratio over [warmup_steps, total_steps], then
// min_lr_ratio. `shape` maps decay progress in [0, 1] to a weight going from 1 to 0.
class WarmupDecay {
 public:
  explicit WarmupDecay(const WarmupDecayConfig& config) : config_(config) {}

  template <class Shape>
  double factor(std::int64_t step, Shape shape) const {
    const auto& c = config_;
    if (step < c.warmup_steps) return warmup_factor(step, c.warmup_steps);
    if (step >= c.total_steps) return c.min_lr_ratio;
    const double progress =
        static_cast<double>(step - c.warmup_steps) / static_cast<double>(c.total_steps - c.warmup_steps);
    return c.min_lr_ratio + (1.0 - c.min_lr_ratio) * shape(std::clamp(progress, 0.0, 1.0));
  }

 private:
  WarmupDecayConfig config_;
};

}  // namespace tessera::schedulers
