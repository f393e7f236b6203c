// A planted fault for tests of NaN handling and loss spikes, on a real trainer.
#pragma once

#include <c10/core/GradMode.h>

#include <cstdint>

#include "tessera/components/callback.hpp"
#include "tessera/components/model.hpp"

namespace tessera::testing {

// Plants a fault: from step_begin of step `at` to before the optimizer step, the first
// parameter is scaled by `factor` (NaN poisons the loss and every gradient), then put back.
class ParameterPoison final : public Callback {
 public:
  // `restore` false: the change stays (a lasting shift rather than a one-step fault).
  ParameterPoison(std::int64_t at, double factor, bool restore = true) : at_(at), factor_(factor), restore_(restore) {}
  void on_step_begin(CallbackContext& ctx) override {
    if (ctx.progress.step + 1 != at_) return;
    c10::NoGradGuard no_grad;
    at::Tensor p = ctx.model.parameters().front();
    saved_ = p.detach().clone();
    p.mul_(factor_);
  }
  void on_before_optimizer_step(CallbackContext& ctx, const BeforeOptimizerStep&) override {
    if (!saved_.defined() || !restore_) return;
    c10::NoGradGuard no_grad;
    ctx.model.parameters().front().copy_(saved_);
    saved_ = at::Tensor();
  }

 private:
  std::int64_t at_;
  double factor_;
  bool restore_;
  at::Tensor saved_;
};

}  // namespace tessera::testing
