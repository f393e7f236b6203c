// Linear warmup and warmup-then-decay, shared by the scheduler plugins (header only; each plugin
// includes it by relative path, so every .so carries its own copy).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "tessera/component_config.hpp"
#include "tessera/error.hpp"
#include "tessera/schema.hpp"

namespace tessera::schedulers {

inline void declare_warmup(Schema& schema) {
  schema.integer("warmup_steps", "steps of linear warmup from 1/warmup_steps up to 1")
      .default_to(0)
      .at_least(0);
}

// (step + 1) / warmup_steps during warmup, so the first step already has a non-zero lr.
inline double warmup_factor(std::int64_t step, std::int64_t warmup_steps) {
  if (step >= warmup_steps) return 1.0;
  return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
}

// Warmup, then a decay from 1 down to min_lr_ratio over [warmup_steps, total_steps], then
// min_lr_ratio. `shape` maps decay progress in [0, 1] to a weight going from 1 to 0.
class WarmupDecay {
 public:
  static void declare(Schema& schema, double default_min_lr_ratio) {
    declare_warmup(schema);
    schema.integer("total_steps", "step at which the decay reaches min_lr_ratio").at_least(1);
    schema.number("min_lr_ratio", "final lr as a fraction of the base lr")
        .default_to(default_min_lr_ratio)
        .at_least(0)
        .at_most(1);
  }

  explicit WarmupDecay(const ComponentConfig& config)
      : warmup_steps_(config.integer("warmup_steps")),
        total_steps_(config.integer("total_steps")),
        min_lr_ratio_(config.number("min_lr_ratio")) {
    if (warmup_steps_ > total_steps_) {
      throw ConfigError("warmup_steps (" + std::to_string(warmup_steps_) +
                            ") must not exceed total_steps (" + std::to_string(total_steps_) + ")",
                        "warmup_steps");
    }
  }

  template <class Shape>
  double factor(std::int64_t step, Shape shape) const {
    if (step < warmup_steps_) return warmup_factor(step, warmup_steps_);
    if (step >= total_steps_) return min_lr_ratio_;
    const double progress = static_cast<double>(step - warmup_steps_) /
                            static_cast<double>(total_steps_ - warmup_steps_);
    return min_lr_ratio_ + (1.0 - min_lr_ratio_) * shape(std::clamp(progress, 0.0, 1.0));
  }

 private:
  std::int64_t warmup_steps_;
  std::int64_t total_steps_;
  double min_lr_ratio_;
};

}  // namespace tessera::schedulers
