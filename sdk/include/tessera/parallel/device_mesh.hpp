// The device mesh of a run (spec section `parallelism:`): the ranks arranged on named axes, this
// rank's coordinate on each, and a communicator per axis and per group of axes. The host builds
// it before any component (RunContext::mesh); a run of one rank, or of data parallelism alone,
// has the trivial mesh, so components never branch on whether there is one.
//
// Axes, outer to inner (torchtitan's order: the tensor-parallel peers are neighbouring ranks, on
// one node's fast links):   pp, dp_replicate, dp_shard, cp, tp
// Rank r's coordinates are r written in that mixed radix. `ep` is not an axis of its own: expert
// parallelism borrows its ranks from the data-parallel ones.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/run/context.hpp"
#include "tessera/export.hpp"
#include "tessera/run/parallel_dims.hpp"

namespace tessera {

class TESSERA_API DeviceMesh {
 public:
  // The groups the host makes, each named by its axes joined with '_' in mesh order ("tp",
  // "dp_replicate_dp_shard", ...). `groups` maps those names to this rank's communicator in each;
  // a group of one rank may be missing (a local communicator stands in).
  DeviceMesh(ParallelDims dims, std::int64_t rank, std::shared_ptr<Communicator> world,
             std::map<std::string, std::shared_ptr<Communicator>> groups);
  // The mesh of a run without model parallelism: every rank data-parallel (dp_shard = world).
  static std::shared_ptr<DeviceMesh> data_parallel_only(std::shared_ptr<Communicator> world);

  const ParallelDims& dims() const { return dims_; }
  std::int64_t rank() const { return rank_; }
  std::int64_t coordinate(MeshAxis axis) const;

  Communicator& world() const { return *world_; }
  // The ranks that differ from this one only on `axes` (in any order); one rank: a local group.
  Communicator& group(const std::vector<MeshAxis>& axes) const;
  std::shared_ptr<Communicator> group_ptr(const std::vector<MeshAxis>& axes) const;
  Communicator& tensor_parallel() const { return group({MeshAxis::tp}); }
  // The data-parallel ranks (dp_replicate x dp_shard): the ranks that read different data and
  // hold the same model shard. A strategy (ddp, zero, fsdp) works over this group.
  Communicator& data_parallel() const { return group({MeshAxis::dp_replicate, MeshAxis::dp_shard}); }
  // The ranks whose gradients are summed: the data-parallel ranks and their context-parallel
  // peers (each computed the gradient of its slice of the same sequences). The strategy (ddp,
  // zero, fsdp) works over this group; the data is split over data_parallel() only.
  Communicator& gradient_group() const {
    return group({MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp});
  }
  // Expert parallelism (parallelism.ep) borrows its ranks from dp_shard: a rank's expert-parallel
  // peers are the ep neighbouring dp_shard ranks (coordinate d: the ranks whose d / ep is its own),
  // each holding num_experts / ep of every MoE layer's experts; its expert data-parallel peers hold
  // the same experts (d % ep its own, any replica, any cp rank) and sum those experts' gradients.
  Communicator& expert_parallel() const;
  Communicator& expert_data_parallel() const;
  std::shared_ptr<Communicator> expert_parallel_ptr() const;
  std::shared_ptr<Communicator> expert_data_parallel_ptr() const;
  // Their global ranks for global rank `member` (`data`: the expert data-parallel group).
  static std::vector<std::int64_t> expert_group_members(const ParallelDims& dims, std::int64_t member, bool data);
  // Every rank: the step's loss (the last pipeline stage's) and the gradient norm (over every
  // stage's parameters) are reduced over all of them.
  Communicator& loss_group() const {
    return group({MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::tp, MeshAxis::pp});
  }
  // Pipeline parallelism: this rank and its peer on the other end of the pipeline (the first and
  // the last stage's ranks with the same other coordinates), which hold an embedding tied to the
  // output head and sum its gradients. The rank alone on a middle stage or without pp.
  std::shared_ptr<Communicator> pipeline_ends_ptr() const;
  static std::vector<std::int64_t> pipeline_ends_members(const ParallelDims& dims, std::int64_t member);
  // Pipeline parallelism: a second group over this rank's pipeline peers, on which gradients travel
  // back while activations travel forward on the pp group. On NCCL the transfers between two ranks
  // of one group run in order on one stream, and a send waits for its receive: with one group, a
  // 1F1B stage sending an activation while its neighbour sends a gradient would wait for ever.
  std::shared_ptr<Communicator> pipeline_gradients_ptr() const;

  // The name of the group of `axes` ("dp_replicate_dp_shard"), in mesh order, axes of size 1 left
  // out ("" when none is left: the rank alone).
  static std::string group_name(const ParallelDims& dims, const std::vector<MeshAxis>& axes);
  // The global ranks of the group of `axes` that contains global rank `member`, ascending.
  static std::vector<std::int64_t> group_members(const ParallelDims& dims, const std::vector<MeshAxis>& axes,
                                                 std::int64_t member);
  // Communicator::bytes_communicated and wait_seconds summed over the world and every group.
  std::int64_t bytes_communicated() const;
  // The same by group: "world" and each group the host made ("tp", "cp", "ep", ...). A group that
  // spans every rank is the world's communicator and counted there, except "ep", which always
  // has its own (its all-to-alls are counted apart from the gradients' reductions).
  std::map<std::string, std::int64_t> bytes_communicated_by_group() const;
  double wait_seconds() const;
  // Every group name the host must make for the named groups above.
  static std::vector<std::vector<MeshAxis>> standard_groups();

 private:
  ParallelDims dims_;
  std::int64_t rank_;
  std::shared_ptr<Communicator> world_;
  std::map<std::string, std::shared_ptr<Communicator>> groups_;
  std::shared_ptr<Communicator> alone_;
};

// The data-parallel group of a run (DeviceMesh::data_parallel()): the ranks that read different
// data. The whole run when it has no mesh yet; one rank when it has no communicator.
TESSERA_API std::shared_ptr<Communicator> data_parallel_group(const RunContext& run);

}  // namespace tessera
