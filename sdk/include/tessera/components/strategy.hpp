// Kind `parallel`: how the ranks of a run share one training step. A strategy decides who holds
// which parameters, gradients and optimizer state and which collectives move them (ddp, zero1,
// zero2, fsdp). The trainer calls it at fixed points of every step:
//
//   setup(model, optimizer, comm)                 once, before the first step
//   per step:  begin_micro_batch(i, n)            before each micro-batch's forward (under
//                                                 pipeline parallelism: before each backward of
//                                                 a stage, several per micro-batch when the rank
//                                                 holds several stages)
//              finish_gradients()                 after the last backward
//              reduce_loss_and_grad_norm(...)     the step's loss and global norm over ranks
//              gradients()                        what clipping scales
//              optimizer_step(optimizer)          the update, and parameters in sync again
//              zero_grad(optimizer)
//
// A run of one rank has a strategy too: the host's `local` one (a null object), so the trainer
// runs one step shape for every run. A strategy built for a run of one rank must give that
// rank's plain result.
//
// The strategy works over the data-parallel ranks of the run's device mesh (the `comm` of setup()
// is DeviceMesh::data_parallel()); with tensor parallelism its parameters are this rank's parts,
// and reduce_loss_and_grad_norm() gets the group of every rank that computes the loss.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

class Communicator;
class Model;
class Optimizer;

// Bytes held on one rank between steps.
struct ParallelMemory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
};

// Bytes of the model's parameters that are not among `trained` (the optimizer's): what adapters
// froze, which a strategy never updates. A strategy that holds them whole (the local one, ddp,
// zero) counts them in memory(); fsdp shards them and counts its shards.
TESSERA_API std::int64_t frozen_parameter_bytes(const Model& model, const std::vector<at::Tensor>& trained);

// A step's loss summed over ranks and the gradients' global L2 norm: 0-dim fp32 tensors on the
// device, never read back to the host here.
struct LossAndGradNorm {
  at::Tensor loss_sum;
  at::Tensor grad_norm;
};

class TESSERA_API ParallelStrategy {
 public:
  static constexpr const char* kKind = "parallel";
  virtual ~ParallelStrategy();

  // The model is on its device and the optimizer was built over its parameters (tensors that
  // keep their identity from here on). Makes every rank start from rank 0's weights, then takes
  // over the parameters and gradients (buckets, shards, hooks).
  virtual void setup(Model& model, Optimizer& optimizer, Communicator& comm) = 0;
  // Whether setup() gives a model's deferred parameters (tessera/nn/deferred_init.hpp) their storage
  // and initial values itself (fsdp: one unit at a time, keeping its shard). When false, the
  // trainer materialises the whole model before setup().
  virtual bool materializes_parameters() const { return false; }
  // Before the forward pass of micro-batch `index` of the `count` in this step.
  virtual void begin_micro_batch(std::int64_t index, std::int64_t count) = 0;
  // After the step's last backward: completes the gradient reduction. The gradients are sums
  // over ranks (each rank scaled its loss by the global token count).
  virtual void finish_gradients() = 0;
  // The gradients this rank's optimizer step reads (whole, or this rank's shard of them).
  virtual std::vector<at::Tensor> gradients() = 0;
  // After finish_gradients(): this rank's part of `param`'s gradient (whole, or the piece of its
  // shard it updates; undefined when it holds none), in place: the host sums a pipeline's tied
  // embedding there over the two ends (Model::pipeline_tied_parameters, which a strategy keeps
  // in units of their own so both ends' pieces line up). The default: param.grad().
  virtual at::Tensor gradient_of(const at::Tensor& param);
  // This rank's share of the squared global gradient norm; the shares of all ranks sum to it.
  // Parameters count_in_grad_norm() left out are not in it.
  virtual at::Tensor grad_norm_squared_share() = 0;
  // Which of optimizer.parameters() this rank counts in the global norm; called once after
  // setup() when the run has tensor parallelism, whose ranks each hold some parameters whole (a
  // norm's weight): tensor-parallel rank 0 alone counts those, or the norm would count them tp
  // times. The default accepts only "every parameter" and refuses anything else.
  virtual void count_in_grad_norm(const std::vector<bool>& counted);
  // After finish_gradients(): `loss_sum` (this rank's summed token loss) summed over ranks, and
  // the global gradient norm. The default does both in one collective, summing
  // [loss_sum, grad_norm_squared_share()] and taking the root; a strategy with a more direct
  // way overrides it (one rank: no collective, the norm taken straight from the gradients).
  virtual LossAndGradNorm reduce_loss_and_grad_norm(Communicator& comm, const at::Tensor& loss_sum);
  // Updates this rank's part with the optimizer (lr already set) and brings the parameters of
  // every rank up to date.
  virtual void optimizer_step(Optimizer& optimizer) = 0;
  virtual void zero_grad(Optimizer& optimizer) = 0;
  // Parameters and gradients this rank holds between steps (optimizer state is the optimizer's).
  virtual ParallelMemory memory() const = 0;
  // The whole parameters by name, as host copies, on every rank (only_rank < 0) or on rank
  // only_rank alone (the others get an empty dict and hold no copy). A collective: every rank
  // calls it.
  virtual StateDict full_parameters(Model& model, std::int64_t only_rank = -1) = 0;

  // --- Checkpoints (how state saved under one layout is loaded under another) -----------------
  // Sets the whole parameters (by name, as full_parameters returns them); each rank keeps its part.
  virtual void load_full_parameters(Model& model, const StateDict& state) = 0;
  // Whether ranks hold different optimizer state (each its own part of every parameter).
  virtual bool shards_optimizer_state() const = 0;
  // Whether another rank holds this rank's part of sharded optimizer state as well (a replica of
  // hybrid sharding, other than the first): checkpoints then write only the first's.
  virtual bool is_optimizer_state_replica() const { return false; }
  // For each parameter of optimizer.parameters(), the elements [begin, end) of the flattened
  // parameter that this rank's optimizer state covers ([0, numel) when not sharded).
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges() const = 0;
  // For each parameter of optimizer.parameters(), the ranks over which its optimizer state is
  // sharded: their owned_ranges() of it, laid end to end in the group's rank order (the empty
  // ones skipped), tile the flattened parameter (hybrid sharding: the shard group, whose replicas hold the same ranges).
  // Null (or a group of one) where this rank's state covers all of it. The default: null for
  // every parameter, which is right for a strategy that does not shard optimizer state.
  virtual std::vector<Communicator*> state_share_groups() const;
  // Runs `fn` while the optimizer's parameters are this rank's parts (1-D, owned_ranges() long),
  // as during optimizer_step: the view under which its state_dict is loaded.
  virtual void with_owned_parameters(const std::function<void()>& fn) = 0;

  // --- Generation (rollouts, sampling) -----------------------------------------------------------
  // Runs `fn` with every parameter of the model whole on this rank, gathered once: the many passes
  // of a generation phase (Model::decode, one per token) then move nothing, and each rank may run
  // its own number of them (its own prompts). fsdp gathers every unit before `fn` and frees them
  // after it, also when it throws; a strategy that keeps the parameters whole (the default) runs
  // `fn` as it is. A collective under fsdp: every rank calls it. No backward inside `fn`.
  virtual void with_whole_parameters(Model& model, const std::function<void()>& fn);

  // --- A frozen copy of the weights: a loss's reference model without adapters (loss/dpo) ------
  // Copies the parameters as they are now into memory held as this strategy holds them between
  // steps: whole on every rank, or (fsdp) each rank its shard. A collective-free copy; every rank
  // calls it at the same point (the trainer: before the first step, or loading a checkpoint).
  void keep_reference_weights(Model& model);
  bool keeps_reference_weights() const;
  // Runs `fn` with the model's parameters holding the kept copy: a forward in it computes the
  // reference model, and full_parameters() / load_full_parameters() read and write the copy. The
  // trained weights are back when it returns or throws. The swap exchanges the memory under each
  // held storage (no copy); autocast's cache of weight casts must not span it (the trainer runs
  // the reference forward under an autocast guard of its own).
  void with_reference_weights(const std::function<void()>& fn);
  // Bytes of the kept copy on this rank (0 when none).
  std::int64_t reference_bytes() const;

 protected:
  // The tensors whose storages hold the parameters' values between steps, each storage once:
  // what keep_reference_weights copies and with_reference_weights swaps. The default, the
  // model's parameters, is right for a strategy that keeps them whole; fsdp gives its shards.
  virtual std::vector<at::Tensor> held_parameter_storages(Model& model);
  // Drops what the strategy derived from those storages (fsdp: the gathered parameters), around
  // the swap, so nothing computes from the other copy's values.
  virtual void release_derived_parameters() {}

 private:
  struct ReferenceWeights;
  std::shared_ptr<ReferenceWeights> reference_;
};

}  // namespace tessera
