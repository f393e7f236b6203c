// One group of parameters laid out end to end in a flat buffer: a DDP bucket, a ZeRO bucket or
// an FSDP wrapping unit. The buffer is padded to a multiple of the world size, and rank r owns
// the contiguous slice [r * shard, (r + 1) * shard) of it: its shard. Each parameter keeps its
// tensor identity throughout (the optimizer and autograd hold it); only what it points at moves:
// a view of the flat buffer normally, a view of this rank's slice during the optimizer step.
#pragma once

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/run/communicator.hpp"

namespace tessera_plugins {

// How a unit's gradients reach the ranks that need them.
enum class GradReduction {
  all_reduce,            // ddp: every rank gets the whole summed gradient
  reduce_scatter_final,  // zero1: whole gradients accumulate locally; scattered once per step
  reduce_scatter_each,   // zero2, fsdp: scattered after every backward; only the shard is kept
  none,                  // fsdp: frozen parameters (adapters train the rest), gathered for compute only
};

// What is all-gathered and reduced, as in PyTorch FSDP2's MixedPrecisionPolicy. The master
// weights, the gradient this rank keeps and the optimizer state stay in the parameters' own dtype.
struct UnitPrecision {
  // fsdp: the dtype the gathered parameters have (forward and backward compute in it); the
  // parameters' dtype (no casts) when undefined. Only for units that shard parameters.
  std::optional<at::ScalarType> param;
  // The dtype gradients travel in for their reduction; the parameters' dtype when undefined.
  std::optional<at::ScalarType> reduce;
};

// A unit whose parameters are still on the meta device (tessera/nn/deferred_init.hpp): the device
// their storage goes on and the model's initializer of their values.
struct DeferredUnitInit {
  c10::Device device{c10::kCPU};
  std::function<void(const std::vector<at::Tensor>&)> initialize;
};

class FlatUnit {
 public:
  // `shard_parameters`: whether the parameters are sharded at rest (fsdp) or every rank keeps
  // them whole (ddp, zero). Moves the parameters' data into the unit's buffer. Deferred
  // parameters (on the meta device) get their storage in the buffer and their values from
  // `deferred` (rank 0's, broadcast): the unit is the only whole copy that ever exists.
  FlatUnit(std::vector<at::Tensor> params, tessera::Communicator& comm, GradReduction reduction,
           bool shard_parameters, UnitPrecision precision = {}, const DeferredUnitInit* deferred = nullptr);

  const std::vector<at::Tensor>& params() const { return params_; }
  tessera::Communicator& comm() const { return comm_; }
  std::int64_t numel() const { return numel_; }
  // Whether the unit's parameters have gradients (false: a frozen unit, GradReduction::none).
  bool trains() const { return reduction_ != GradReduction::none; }

  // --- Gradients -------------------------------------------------------------------------------
  // Points each parameter's .grad at the unit's flat gradient buffer (ddp, zero1), zeroed.
  void zero_grad();
  // Counts a parameter whose gradient is complete; true when the whole unit is.
  bool mark_ready();
  // Starts the unit's reduction. `last_micro_batch`: whether this backward ends the step (ddp and
  // zero1 reduce only then; the others reduce every backward).
  void launch_reduction(bool last_micro_batch);
  // Waits for a started reduction and folds it into the gradient this rank keeps.
  void wait_reduction();
  // Before each backward: forget which parameters were ready.
  void reset_ready();
  // Gradients the optimizer step reads: the whole flat gradient (ddp) or this rank's shard.
  at::Tensor owned_gradient() const;
  // The pieces of owned_gradient() that belong to the parameters i with counted[i] (views).
  std::vector<at::Tensor> owned_gradient_pieces(const std::vector<bool>& counted) const;

  // --- Parameters ------------------------------------------------------------------------------
  bool gathered() const { return gathered_; }
  // This rank's shard of the parameters (fsdp: its own storage, the master weights at rest).
  const at::Tensor& shard() const { return param_shard_; }
  // Brings every rank's shard into the whole buffer (allocating it again if freed).
  std::shared_ptr<tessera::PendingCollective> start_gather();
  void gather() { start_gather()->wait(); }
  // Releases the whole buffer's memory (fsdp); the parameters' views stay, pointing at nothing.
  void free_full();
  // Points every parameter (and its .grad) at its part of this rank's shard, for the optimizer.
  void point_at_shard();
  // Points every parameter back at its whole view (and .grad at the flat gradient, or nothing).
  void point_at_full();
  // The parameter i whole (gathering if need be is the caller's business).
  at::Tensor full_view(std::size_t i) const { return full_views_[i]; }
  // The elements [begin, end) of parameter i (flattened) that this rank's optimizer updates.
  std::pair<std::int64_t, std::int64_t> owned_range(std::size_t i) const;
  // fsdp: after the whole buffer was written (loading a checkpoint), refreshes this rank's shard.
  void shard_from_full();
  // Hybrid sharding: this rank's shard becomes the first replica's (`replicas`: the ranks
  // holding the same shard), so replicas start alike whatever each one's initialisation did.
  void take_first_replicas_shard(tessera::Communicator& replicas);

  // --- Master weights (checkpoints) --------------------------------------------------------------
  // Whether the gathered parameters are a cast of the master weights (param dtype set and other).
  bool casts_parameters() const { return param_dtype_ != master_dtype_; }
  // The whole master weights in a new flat buffer (a collective: every rank calls it).
  at::Tensor gather_master();
  // An empty flat buffer for master weights, to fill and hand to load_master().
  at::Tensor new_master() const;
  // This rank's shard of `flat` becomes its master weights (the gathered copy, if any, too).
  void load_master(const at::Tensor& flat);
  // Parameter i's view of a flat buffer laid out like this unit's.
  at::Tensor view_of(const at::Tensor& flat, std::size_t i) const;

  std::int64_t parameter_bytes() const;
  std::int64_t gradient_bytes() const;

 private:
  std::int64_t shard_begin() const { return rank_ * shard_numel_; }
  // Parameter i's elements inside this rank's shard, as [begin, end) offsets into the shard.
  std::pair<std::int64_t, std::int64_t> shard_range(std::size_t i) const;
  std::vector<at::Tensor> chunks(const at::Tensor& flat) const;

  tessera::Communicator& comm_;
  GradReduction reduction_;
  bool shard_parameters_;
  std::int64_t rank_, world_;
  std::vector<at::Tensor> params_;
  std::vector<std::int64_t> offsets_;
  std::int64_t numel_ = 0, shard_numel_ = 0;
  at::ScalarType master_dtype_, param_dtype_, reduce_dtype_;

  at::Tensor full_;                    // flat, padded; fsdp frees its storage between uses
  std::vector<at::Tensor> full_views_; // per parameter, shaped like it, into full_
  at::Tensor param_shard_;             // zero: a view of full_; fsdp: its own storage
  bool gathered_ = true;

  at::Tensor grad_flat_;   // ddp: flat summed gradient; zero1: flat padded local gradient
  at::Tensor grad_shard_;  // zero, fsdp: this rank's summed gradient shard
  at::Tensor scatter_in_, scatter_out_;  // a reduction in flight in reduce dtype (when it casts, or each backward's)
  at::Tensor gather_in_;                 // a gather in flight: this rank's shard cast to the param dtype
  std::shared_ptr<tessera::PendingCollective> pending_;
  std::size_t ready_ = 0;
};

}  // namespace tessera_plugins
