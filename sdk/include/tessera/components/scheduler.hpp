// Kind `scheduler`: the learning-rate multiplier as a pure function of the step, so it needs no
// state to resume.
#pragma once

#include <cstdint>

#include "tessera/export.hpp"

namespace tessera {

class TESSERA_API Scheduler {
 public:
  static constexpr const char* kKind = "scheduler";
  virtual ~Scheduler();
  // Multiplier of the optimizer's base lr for optimizer step `step` (0-based).
  virtual double lr_factor(std::int64_t step) const = 0;
  // The lr of step `step` for the optimizer's `base_lr`; what the trainer sets. The default is
  // base_lr * lr_factor(step); a schedule with an absolute floor (lr_min) overrides it.
  virtual double lr(std::int64_t step, double base_lr) const { return base_lr * lr_factor(step); }
};

}  // namespace tessera
