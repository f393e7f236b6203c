// Where each rank's tensor lives in the whole: a parameter's placement is data (its whole shape,
// the part of it this rank holds along which mesh axis, whether this rank's copy is the one that
// counts), so gathering, cutting, counting and choosing who writes follow from the data instead
// of rank tests wherever a whole is needed. Megatron-core's ShardedTensor (global shape, offset,
// replica id) and DTensor's Shard/Replicate placements carry the same facts.
//
// The axes a placement can name: the tensor-parallel split of the model's plan (padded or not),
// the expert-parallel split of stacked experts, the pipeline stage that holds a tied copy, and
// the data-parallel strategy's share of the local tensor (zero's and fsdp's flat shards:
// Placement::state, filled from the strategy). Placements gather and cut along the model's axes;
// an optimizer's parameters, shares included, are OptimizerPlacements
// (tessera/parallel/optimizer_placements.hpp), and a model's whole weights under fsdp come from
// the strategy's gather of its units (ParallelStrategy::full_parameters) first.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/run/context.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

class DeviceMesh;

// One local tensor's place in its whole.
struct TESSERA_API Placement {
  std::vector<std::int64_t> whole_shape;  // the whole tensor's (a padded vocabulary's padding left out)
  TensorShard shard;                      // how the whole is cut; replicated: this rank holds it whole
  ShardRanks part;                        // which part this rank holds, of how many (its axis' ranks)
  // This rank's copy among the ranks that hold the same values of it over the model's axes: a
  // replicated tensor or a stacked expert on each tensor-parallel rank. Copy 0 is the owner.
  std::int64_t replica = 0;
  // A pipeline's second copy of a tied tensor (the last stage's embedding, used by its head):
  // equal to the first stage's, which is the one counted and written.
  bool tied_copy = false;
  // This rank's share of the tensor's optimizer state over the data-parallel ranks, as the
  // parallel strategy holds it (the trainer fills it from ParallelStrategy::owned_ranges):
  // elements [begin, end) of the flattened local tensor, all of them unless the strategy shards
  // optimizer state (zero, fsdp); `replica`: another rank holds the same share first (hybrid
  // sharding's replicas).
  struct StateShare {
    std::int64_t begin = 0, end = 0;
    bool sharded = false, replica = false;
  } state;

  // Counted in whole counts and gradient norms on this rank (one copy of every element is).
  bool counted() const { return replica == 0 && !tied_copy; }
  // The local tensor is not the whole: split over several ranks, or padded on this one.
  bool cut() const {
    return (!shard.replicated() && part.size > 1) || (shard.padded() && shard.padded_part(1) != shard.whole);
  }
  std::int64_t whole_numel() const;
};

// Every rank's `local` (host tensors) onto rank 0 of `group`, which gets their union (a name on
// several ranks keeps the lowest rank's tensor: a tied embedding is the first stage's); the
// others get an empty dict. Point to point: every rank of `group` calls it.
TESSERA_API StateDict gather_state_dicts(const StateDict& local, Communicator& group);

// The placements of one model's parameters on this rank, and what they make possible: whole
// tensors gathered, cut again, counted, and the ranks that write each distinct part.
class TESSERA_API Placements {
 public:
  // One rank: every tensor whole here (a padded vocabulary still has its padding).
  Placements();
  // `run`'s mesh (its tensor-, expert- and pipeline-parallel groups), the model's split plan
  // (Model::tensor_parallel_plan) and the names it ties across a pipeline's two ends
  // (Model::pipeline_tied_parameters).
  Placements(const RunContext& run, TensorParallelPlan plan, const std::vector<std::string>& tied = {});

  // The placement of `local`, this rank's tensor named `name`.
  Placement of(const std::string& name, const at::Tensor& local) const;
  const TensorParallelPlan& plan() const { return plan_; }
  // Some tensor is cut on this mesh (or a padded vocabulary on one rank): checkpoints record
  // each part's layout.
  bool cuts_any() const;

  // --- Whole from parts ----------------------------------------------------------------------------
  // Whole tensors from this rank's `local` ones (host or device, by name): joined over the
  // tensor-parallel ranks, then the expert-parallel ones, then the pipeline's stages, each onto
  // its group's rank 0, one tensor at a time. Rank 0 of all three gets the whole model (host
  // copies where a stage sent them), every other rank an empty dict. A collective of those
  // groups: every rank calls it with the same names as its peers.
  StateDict gather_whole(const StateDict& local) const;
  // The whole of one tensor on every rank of its axis (an all-gather; a tensor whole here is
  // returned as it is): what an optimizer orthogonalising whole matrices, or a generator under a
  // split model, asks for. A collective of the axis' ranks.
  at::Tensor whole(const std::string& name, const at::Tensor& local) const;
  // Every tensor of `local` whole on this rank: each cut one all-gathered over its axis, in name
  // order (a collective of every rank of the mesh's model axes, each calling it with the same
  // names). What generation and rollouts read under tp and ep, after the data-parallel strategy
  // gathered its shards (ParallelStrategy::full_parameters). Not under a pipeline, whose stages
  // hold different blocks: gather_whole brings those together on rank 0.
  StateDict whole_everywhere(const StateDict& local) const;
  // This rank's parts of `whole`: each tensor cut by its placement (itself where nothing is cut).
  StateDict cut(const StateDict& whole) const;

  // --- Counting and writing ------------------------------------------------------------------------
  // The whole elements of the tensors `selected` picks among `named` (this rank's), each counted
  // once over the ranks; summed over the pipeline's stages (a collective of them). One count per
  // selector, in order.
  std::vector<std::int64_t> count_whole(
      const std::vector<std::pair<std::string, at::Tensor>>& named,
      const std::vector<std::function<bool(const std::string&, const at::Tensor&)>>& selected) const;
  // Whether this rank writes the optimizer state of a tensor placed as `p`: one rank per distinct
  // part. A sharded state share is written by each rank but a replica; a whole one by the first
  // data-parallel rank (for a stacked expert the first of its expert-data group).
  bool writes_state(const Placement& p) const;

  // This rank's place among the tensor-parallel ranks: the owner of the sharded random stream,
  // and copy 0 of every value they all hold (a step's loss).
  ShardRanks tensor_ranks() const { return tp_.ranks(); }

 private:
  TensorParallel tp_;
  ExpertParallel ep_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::shared_ptr<Communicator> stages_;  // the pipeline's stages; null without a pipeline
  bool first_stage_ = true;
  TensorParallelPlan plan_;
  std::set<std::string> tied_;
};

}  // namespace tessera
