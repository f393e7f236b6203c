// Expert parallelism for mixture-of-experts layers (parallelism.ep): each rank of an
// expert-parallel group holds num_experts / ep of every MoE layer's experts (the stacked expert
// tensors split along their first dimension, TensorShard::expert_stack) and runs them on the
// tokens every peer routes to them. Tokens travel to their experts and back with all-to-alls of
// uneven parts (collectives::all_to_all_rows). The group is borrowed from the data-parallel
// ranks (DeviceMesh::expert_parallel), so each peer routes its own batch's tokens; the experts'
// gradients are summed over the ranks that hold the same experts
// (DeviceMesh::expert_data_parallel), which the data-parallel strategies do.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/run/context.hpp"
#include "tessera/export.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera {

class TESSERA_API ExpertParallel {
 public:
  // One rank: every expert here.
  ExpertParallel();
  explicit ExpertParallel(std::shared_ptr<Communicator> group);
  // This run's expert-parallel group from its mesh (one rank when it has none).
  static ExpertParallel of(const RunContext& run);

  std::int64_t size() const { return size_; }
  std::int64_t rank() const { return rank_; }
  const std::shared_ptr<Communicator>& group() const { return group_; }
  // This rank's experts of `experts`: [first(experts), first(experts) + local(experts)).
  std::int64_t local(std::int64_t experts) const { return experts / size_; }
  std::int64_t first(std::int64_t experts) const { return rank_ * local(experts); }

 private:
  std::shared_ptr<Communicator> group_;
  std::int64_t size_ = 1, rank_ = 0;
};

// The ranks `shard`'s parts are spread over: the expert-parallel ones for stacked experts, the
// tensor-parallel ones for the rest.
inline ShardRanks ranks_of(const TensorShard& shard, const TensorParallel& tp, const ExpertParallel& ep) {
  return shard.experts ? ShardRanks{ep.rank(), ep.size()} : tp.ranks();
}

}  // namespace tessera
