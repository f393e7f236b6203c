// Kind `optimizer`: updates parameters from their gradients. The trainer owns the learning-rate
// schedule: before every step it sets lr = base_lr() * scheduler factor.
//
// State convention (what lets checkpoints reshard): per-parameter state lives under keys
// "param.<i>.<field>", <i> indexing parameters(); such a tensor is shaped like parameter i (or,
// under a sharding strategy, is 1-D over the part of it this rank owns), or is 0-dimensional
// (a step count). Sharding strategies point each parameter at its part before step() and
// load_state_dict(), so an optimizer that creates state like its parameters needs nothing else.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

class OptimizerPlacements;

class TESSERA_API Optimizer : public Stateful {
 public:
  static constexpr const char* kKind = "optimizer";
  ~Optimizer() override;

  virtual void step() = 0;
  virtual void zero_grad() = 0;
  virtual double base_lr() const = 0;
  virtual void set_lr(double lr) = 0;
  // The parameters this optimizer updates (for clipping and reporting).
  virtual std::vector<at::Tensor> parameters() const = 0;
  // Bytes of optimizer state this rank holds now, counted without copying anything (the memory
  // report reads it after the first step).
  virtual std::int64_t state_bytes() const = 0;

  // Skipping a step on the device. The trainer skips a step whose loss or gradient norm is not
  // finite (trainer.nonfinite). By default it reads that flag on the host first and then does
  // not call step(): one wait for the device, before the update, every step. An optimizer that
  // can skip on the device returns true here. The trainer then hands it the flag instead, through
  // skip_next_step_if, and calls step() regardless.
  virtual bool can_skip_on_device() const { return false; }
  // For the next step() only: `found_inf` is a float32 scalar on the parameters' device. Where
  // it is 1, that step leaves the parameters and every bit of the state (step counts included)
  // as they were; where it is 0, the step is as usual. Only called when can_skip_on_device().
  virtual void skip_next_step_if(const at::Tensor& found_inf) { (void)found_inf; }

  // Where each of parameters() lives on this rank (tessera/parallel/optimizer_placements.hpp):
  // its whole shape, its part along the model's axes, this rank's share of it under a sharding
  // strategy, and the gathers that make it whole. The trainer calls it once, after the parallel
  // strategy's setup and before the first step (and on one rank as well, nothing cut). An
  // optimizer that transforms whole matrices keeps it; the default ignores it.
  virtual void set_placements(std::shared_ptr<const OptimizerPlacements> placements) { (void)placements; }
};

}  // namespace tessera
