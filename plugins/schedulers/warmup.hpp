// Linear warmup and warmup-then-decay, shared by the scheduler plugins (header only; each plugin
// includes it by relative path, so every .so carries its own copy): their declared config parts
// and the factors they compute.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "tessera/config/config_fields.hpp"
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

// Decay shapes: decay progress in [0, 1] to a weight going from 1 to 0.
inline double linear_shape(double p) { return 1.0 - p; }
inline double cosine_shape(double p) { return 0.5 * (1.0 + std::cos(3.14159265358979323846 * p)); }
inline double one_minus_sqrt_shape(double p) { return 1.0 - std::sqrt(p); }

struct WarmupDecayConfig : WarmupConfig {
  std::optional<double> warmup_ratio;  // warmup as a fraction of total_steps instead of warmup_steps
  std::int64_t total_steps = 1;
  double min_lr_ratio;
  std::optional<double> lr_min;  // an absolute floor instead of min_lr_ratio
  std::set<std::string> given;

  // Each schedule has its own default floor (0 for linear, 0.1 for cosine).
  explicit WarmupDecayConfig(double default_min_lr_ratio) : min_lr_ratio(default_min_lr_ratio) {}

  std::int64_t resolved_warmup_steps() const {
    if (!warmup_ratio) return warmup_steps;
    return static_cast<std::int64_t>(std::llround(*warmup_ratio * static_cast<double>(total_steps)));
  }
};

template <class Config>
void declare_warmup_decay(ConfigFields<Config>& f) {
  declare_warmup(f);
  f.field("warmup_ratio", &WarmupDecayConfig::warmup_ratio,
          "warmup as a fraction of total_steps (instead of warmup_steps)")
      .at_least(0)
      .at_most(1);
  f.field("total_steps", &WarmupDecayConfig::total_steps, "step at which the decay reaches its floor")
      .required()
      .at_least(1);
  f.field("min_lr_ratio", &WarmupDecayConfig::min_lr_ratio, "final lr as a fraction of the base lr").at_least(0).at_most(1);
  f.field("lr_min", &WarmupDecayConfig::lr_min, "final lr as an absolute value (instead of min_lr_ratio)").at_least(0);
  f.record_given(&WarmupDecayConfig::given);
  f.check([](const Config& c) {
    if (c.warmup_ratio && c.given.count("warmup_steps")) {
      throw ConfigError("give warmup_steps or warmup_ratio, not both", "warmup_ratio");
    }
    if (c.lr_min && c.given.count("min_lr_ratio")) throw ConfigError("give min_lr_ratio or lr_min, not both", "lr_min");
    if (c.resolved_warmup_steps() > c.total_steps) {
      throw ConfigError("warmup_steps (" + std::to_string(c.warmup_steps) + ") must not exceed total_steps (" +
                            std::to_string(c.total_steps) + ")",
                        "warmup_steps");
    }
  });
}

// Warmup, then 1 until `decay_start`, then a decay from 1 down to the floor (min_lr_ratio, or
// lr_min / base lr) over [decay_start, total_steps], then the floor. `shape` maps decay progress
// in [0, 1] to a weight going from 1 to 0.
class WarmupDecay {
 public:
  explicit WarmupDecay(const WarmupDecayConfig& config) : config_(config), warmup_(config.resolved_warmup_steps()) {}

  std::int64_t warmup_steps() const { return warmup_; }

  // The lr at `step` for `base_lr`; decay starts at `decay_start` (at the end of warmup when
  // earlier).
  template <class Shape>
  double lr(std::int64_t step, double base_lr, Shape shape, std::int64_t decay_start = 0) const {
    const auto& c = config_;
    const double floor = c.lr_min ? std::min(1.0, *c.lr_min / base_lr) : c.min_lr_ratio;
    return base_lr * factor(step, floor, shape, decay_start);
  }

  // The factor with min_lr_ratio as the floor (what lr_factor reports).
  template <class Shape>
  double factor(std::int64_t step, Shape shape, std::int64_t decay_start = 0) const {
    return factor(step, config_.min_lr_ratio, shape, decay_start);
  }

 private:
  template <class Shape>
  double factor(std::int64_t step, double floor, Shape shape, std::int64_t decay_start) const {
    const auto& c = config_;
    if (step < warmup_) return warmup_factor(step, warmup_);
    const std::int64_t begin = std::max(decay_start, warmup_);
    if (step < begin) return 1.0;
    if (step >= c.total_steps) return floor;
    const double progress = static_cast<double>(step - begin) / static_cast<double>(c.total_steps - begin);
    return floor + (1.0 - floor) * shape(std::clamp(progress, 0.0, 1.0));
  }

  WarmupDecayConfig config_;
  std::int64_t warmup_;
};

}  // namespace tessera::schedulers
