// The data-parallel strategies (kind `parallel`): one class, configured four ways.
//
//   ddp    whole parameters, gradients and optimizer state on every rank; gradient buckets are
//          all-reduced as soon as backward fills them, on the step's last micro-batch only.
//   zero1  as ddp, but the optimizer state is sharded: the last backward reduce-scatters each
//          bucket, each rank updates its shard, and the parameters are all-gathered.
//   zero2  zero1 with gradients sharded too: every backward reduce-scatters each bucket as it
//          fills and keeps only the shard.
//   fsdp   parameters sharded at rest as well, in the model's wrapping units (a GPT's blocks):
//          each unit is gathered just before its forward and again before its backward, and
//          freed after each; gradients are reduce-scattered per unit as in zero2. Parameters
//          no optimizer updates (a base that adapters froze) are sharded the same way, in units of
//          their own that are gathered for compute and never reduced. With
//          parallelism.dp_replicate > 1, hybrid sharding: sharded over the dp_shard ranks,
//          replicated (gradient shards all-reduced) across the dp_replicate ranks.
//
// All of them work over the data-parallel ranks of the device mesh; with tensor parallelism the
// parameters are this rank's parts, and the norm counts the replicated ones on tensor-parallel
// rank 0 only (count_in_grad_norm). Under expert parallelism the stacked experts (this rank's
// share of each MoE layer's) are buckets and units of their own, reduced over the expert
// data-parallel group (the ranks holding the same experts) instead: their gradients already hold
// every expert-parallel peer's tokens.
//
// Collectives start from autograd hooks while backward still runs (overlap), always in the same
// unit order on every rank.
//
// A parameter that gets no gradient in a step (used by no micro-batch) takes no optimizer step
// with one process: its .grad stays undefined. Buckets and shards give every parameter a
// gradient, zero for an unused one, which AdamW would still decay and move by its moments. So
// each rank records which parameters autograd reached in the step, and ddp, zero1 and zero2
// agree on them with one small host all-reduce per step (one reached by some rank has its right
// gradient). One that no rank reached is an error on every rank, or with find_unused_parameters
// gets no update, as with one process. fsdp refuses one that a rank did not reach.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "flat_unit.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/strategy.hpp"

namespace tessera_plugins {

struct DataParallelOptions {
  std::string name;  // for messages: ddp, zero1, zero2, fsdp
  GradReduction reduction = GradReduction::all_reduce;
  bool shard_parameters = false;      // fsdp
  std::int64_t bucket_bytes = 25 << 20;  // ddp, zero: gradient bucket size
  bool prefetch = true;               // fsdp: gather the next unit while this one computes
  UnitPrecision precision;            // what is gathered (fsdp) and reduced
  c10::Device device{c10::kCPU};      // the run's device: where fsdp gives deferred parameters storage
  bool find_unused_parameters = false;  // ddp, zero: parameters unused in a step are agreed on, not refused
  // fsdp with parallelism.dp_replicate > 1 (hybrid sharding): units shard over `shard_group` (the
  // mesh's dp_shard ranks), and each gradient shard is then all-reduced over `replicate_group`
  // (the dp_replicate ranks holding the same shard). Null: shard over every data-parallel rank.
  std::shared_ptr<tessera::Communicator> shard_group, replicate_group;
  // Expert parallelism (parallelism.ep): the stacked experts of an MoE model (the model's plan
  // marks them TensorShard::experts) are different on every expert-parallel rank, so their
  // gradients are summed, and their state sharded, over `expert_group` (the ranks holding the
  // same experts) in units of their own. Null: no expert parallelism.
  std::shared_ptr<tessera::Communicator> expert_group;
  // Pipeline parallelism (parallelism.pp > 1): a stage's backward reaches its own units only, and
  // a rank may hold several stages, so each backward reduces the units it reached (none waits
  // for units of another stage); parameters the model ties across the pipeline's ends
  // (Model::pipeline_tied_parameters) get units of their own.
  bool pipeline = false;
};

// The model's parameter names by tensor: how the strategies name the parameters of their units.
std::map<const c10::TensorImpl*, std::string> parameter_names(tessera::Model& model);

class DataParallel final : public tessera::ParallelStrategy,
                           public tessera::ForwardHooks,
                           public std::enable_shared_from_this<DataParallel> {
 public:
  explicit DataParallel(DataParallelOptions options) : options_(std::move(options)) {}

  void setup(tessera::Model& model, tessera::Optimizer& optimizer, tessera::Communicator& comm) override;
  void begin_micro_batch(std::int64_t index, std::int64_t count) override;
  void finish_gradients() override;
  at::Tensor gradient_of(const at::Tensor& param) override;
  std::vector<at::Tensor> gradients() override;
  at::Tensor grad_norm_squared_share() override;
  void count_in_grad_norm(const std::vector<bool>& counted) override;
  bool is_optimizer_state_replica() const override;
  void optimizer_step(tessera::Optimizer& optimizer) override;
  void zero_grad(tessera::Optimizer& optimizer) override;
  tessera::ParallelMemory memory() const override;
  tessera::StateDict full_parameters(tessera::Model& model, std::int64_t only_rank = -1) override;
  void load_full_parameters(tessera::Model& model, const tessera::StateDict& state) override;
  bool materializes_parameters() const override { return options_.shard_parameters; }
  bool shards_optimizer_state() const override { return options_.reduction != GradReduction::all_reduce; }
  std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges() const override;
  std::vector<tessera::Communicator*> state_share_groups() const override;
  void with_owned_parameters(const std::function<void()>& fn) override;

  // fsdp: the reference copy (keep_reference_weights) is of each unit's shard, and the gathered
  // parameters are released around the swap.
  std::vector<at::Tensor> held_parameter_storages(tessera::Model& model) override;
  void release_derived_parameters() override;
  // fsdp: every unit gathered for the whole of `fn`, the forward hooks freeing none meanwhile.
  void with_whole_parameters(tessera::Model& model, const std::function<void()>& fn) override;

  // fsdp: called by the model around its units (ForwardHooks).
  void before_forward(std::size_t unit) override;
  at::Tensor after_forward(std::size_t unit, const at::Tensor& output) override;

  // Called from autograd once parameter `index` of unit `unit` has its gradient for this backward.
  void on_grad_ready(std::size_t unit, std::size_t index);

 private:
  void broadcast_from_rank0(tessera::Model& model);
  void build_buckets(const std::vector<at::Tensor>& params);
  void build_fsdp_units(tessera::Model& model, const std::vector<at::Tensor>& params);
  void install_grad_hooks();
  void launch_ready_units();
  // Ends a backward: starts what never got ready (unused parameters) and waits for everything.
  void complete_backward();
  // After the step's last backward: the ranks agree on which parameters some rank used (used_),
  // and those none used are refused, or left for drop_unused_gradients (find_unused_parameters).
  void settle_unused_parameters();
  // Before the optimizer step: those no rank used lose their gradient, so they are not updated.
  void drop_unused_gradients();
  // fsdp: the units behind a forward unit index (kWholeModel: the root's).
  const std::vector<FlatUnit*>& forward_unit(std::size_t unit);
  void ensure_gathered(FlatUnit& unit);
  void prefetch(FlatUnit* unit);
  // fsdp: frees a unit's whole parameters (no-op for ddp and zero, which keep them).
  void release(FlatUnit& unit);
  // fsdp: frees the frozen units of forward unit `unit` (the others are freed by their reduction).
  void release_frozen(std::size_t unit);
  void check_setup(const char* what) const;

  // Inside with_whole_parameters: every unit stays gathered.
  bool holding_whole_ = false;

  // Hybrid sharding: the unit gradients all-reduced over the replicas.
  void reduce_over_replicas();

  DataParallelOptions options_;
  tessera::Communicator* comm_ = nullptr;       // every data-parallel rank
  tessera::Communicator* unit_comm_ = nullptr;  // the ranks units shard over (comm_ unless hybrid)
  // In the order their reductions start: reverse of the forward order (backward's order).
  std::vector<std::unique_ptr<FlatUnit>> units_;
  std::vector<bool> ready_;
  std::size_t next_launch_ = 0;
  bool last_micro_batch_ = true;
  bool in_backward_ = false;
  // fsdp: forward unit index -> its units_ (the dense part and, under expert parallelism, the
  // experts' part); the root holds parameters outside every unit.
  std::vector<std::vector<FlatUnit*>> forward_units_;
  std::vector<FlatUnit*> root_;
  // The stacked experts' parameters (expert parallelism), and the communicator of a parameter's
  // unit: the experts' group for them, unit_comm_ for the others.
  std::set<const c10::TensorImpl*> experts_;
  // Parameters in units of their own (a pipeline's tied embedding).
  std::set<const c10::TensorImpl*> apart_;
  // Under a pipeline schedule: which units this backward launched, and whether the step's first
  // backward began.
  std::vector<bool> launched_;
  // Under a pipeline: the units whose last micro-batch's reduction ran this step. A bucket holding
  // parameters of two stages (interleaved schedules) is never whole in one stage's backward: it
  // reduces at finish_gradients, once every stage's backward is done.
  std::vector<bool> final_launched_;
  bool step_begun_ = false;
  tessera::Communicator& comm_for(const at::Tensor& p) const;
  // The ranks holding the same values of `p` (the expert data-parallel group for stacked experts).
  tessera::Communicator& holders_of(const at::Tensor& p) const;
  // Splits parameters into the others and the experts, order kept.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> split_experts(const std::vector<at::Tensor>& params) const;
  std::map<FlatUnit*, std::shared_ptr<tessera::PendingCollective>> gathering_;
  // optimizer.parameters(), in order, and where each lives: (unit index, index in the unit).
  std::vector<at::Tensor> optimized_;
  std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> where_;
  // Per unit and parameter: the model's name, and whether autograd reached it in this step.
  std::vector<std::vector<std::string>> names_;
  std::vector<std::vector<bool>> used_;
  bool all_used_ = true;  // the last settle found no parameter unused
  // Per unit and parameter: whether this rank counts it in the gradient norm (count_in_grad_norm).
  std::vector<std::vector<bool>> counted_;
  bool counts_all_ = true;
  // The model's parameters outside the optimizer (frozen by adapters). ddp and zero hold them
  // whole (frozen_bytes_); fsdp shards them in frozen units (GradReduction::none), listed in
  // forward_units_ and root_ beside the trained ones but not in units_: they have no gradient,
  // no reduction and no optimizer state.
  std::int64_t frozen_bytes_ = 0;
  std::vector<std::unique_ptr<FlatUnit>> frozen_units_;
  std::set<const c10::TensorImpl*> in_frozen_units_;
  // units_ and frozen_units_: every unit whose parameters a checkpoint saves and loads.
  std::vector<FlatUnit*> all_units() const;
};

}  // namespace tessera_plugins
