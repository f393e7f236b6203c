// Kind `parallel`: how the ranks of a run share one training step. A strategy decides who holds
// which parameters, gradients and optimizer state and which collectives move them (ddp, zero1,
// zero2, fsdp). The trainer calls it at fixed points of every step:
//
//   setup(model, optimizer, comm)                 once, before the first step
//   per step:  begin_micro_batch(i, n)            before each micro-batch's forward
//              finish_gradients()                 after the last backward
//              gradients(), grad_norm_squared_share()   clipping and the global norm
//              optimizer_step(optimizer)          the update, and parameters in sync again
//              zero_grad(optimizer)
//
// A strategy built for a run of one rank must give that rank's plain result.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/stateful.hpp"

namespace tessera {

class Communicator;
class Model;
class Optimizer;

// Bytes held on one rank between steps.
struct ParallelMemory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
};

class TESSERA_API ParallelStrategy {
 public:
  static constexpr const char* kKind = "parallel";
  virtual ~ParallelStrategy();

  // The model is on its device and the optimizer was built over its parameters (tensors that
  // keep their identity from here on). Makes every rank start from rank 0's weights, then takes
  // over the parameters and gradients (buckets, shards, hooks).
  virtual void setup(Model& model, Optimizer& optimizer, Communicator& comm) = 0;
  // Before the forward pass of micro-batch `index` of the `count` in this step.
  virtual void begin_micro_batch(std::int64_t index, std::int64_t count) = 0;
  // After the step's last backward: completes the gradient reduction. The gradients are sums
  // over ranks (each rank scaled its loss by the global token count).
  virtual void finish_gradients() = 0;
  // The gradients this rank's optimizer step reads (whole, or this rank's shard of them).
  virtual std::vector<at::Tensor> gradients() = 0;
  // This rank's share of the squared global gradient norm; the shares of all ranks sum to it.
  virtual at::Tensor grad_norm_squared_share() = 0;
  // Updates this rank's part with the optimizer (lr already set) and brings the parameters of
  // every rank up to date.
  virtual void optimizer_step(Optimizer& optimizer) = 0;
  virtual void zero_grad(Optimizer& optimizer) = 0;
  // Parameters and gradients this rank holds between steps (optimizer state is the optimizer's).
  virtual ParallelMemory memory() const = 0;
  // The whole parameters by name, the same on every rank. A collective: every rank calls it.
  virtual StateDict full_parameters(Model& model) = 0;
};

}  // namespace tessera
