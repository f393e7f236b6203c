#include "tessera/core/train/tensor_parallel_state.hpp"

#include <ATen/ops/empty_like.h>

#include <vector>

namespace tessera::core {

namespace {

// The parts of the parameters `splits` picks travel to rank 0 of `group` alone, one parameter at a
// time: no rank ever holds more than the whole model once (rank 0) or its own part (the others).
// The other parameters stay with rank 0.
template <class Splits>
StateDict join_over(const StateDict& local, const TensorParallelPlan& plan, Communicator& group, const Splits& splits) {
  const std::int64_t size = group.world_size();
  const bool keeper = group.rank() == 0;
  StateDict whole;
  for (const auto& [name, part] : local) {  // in name order, the same on every rank
    const TensorShard shard = shard_in(plan, name);
    if (!splits(shard)) {
      if (keeper) whole[name] = part;
      continue;
    }
    at::Tensor mine = part.contiguous();
    if (!keeper) {
      group.send_async(mine, 0)->wait();
      continue;
    }
    std::vector<at::Tensor> parts{mine};
    for (std::int64_t r = 1; r < size; ++r) {
      parts.push_back(at::empty_like(mine));
      group.recv_async(parts.back(), r)->wait();
    }
    whole[name] = TensorParallel::join(parts, shard);
  }
  return whole;
}

}  // namespace

StateDict join_tensor_parallel(const StateDict& local, const TensorParallelPlan& plan, const TensorParallel& tp) {
  if (tp.size() == 1) {
    // One rank's padded vocabulary (pad_vocab_to_multiple_of) is saved without its padding.
    StateDict whole = local;
    for (auto& [name, t] : whole) {
      const TensorShard shard = shard_in(plan, name);
      if (shard.padded()) t = TensorParallel::join({t}, shard);
    }
    return whole;
  }
  return join_over(local, plan, *tp.group(),
                   [](const TensorShard& shard) { return !shard.replicated() && !shard.experts; });
}

StateDict join_expert_parallel(const StateDict& local, const TensorParallelPlan& plan, const ExpertParallel& ep) {
  if (ep.size() == 1) return local;
  return join_over(local, plan, *ep.group(), [](const TensorShard& shard) { return shard.experts; });
}

StateDict cut_tensor_parallel(const StateDict& whole, const TensorParallelPlan& plan, const TensorParallel& tp,
                              const ExpertParallel& ep) {
  StateDict local;  // part_of is the tensor itself where nothing is split or padded
  for (const auto& [name, t] : whole) {
    const TensorShard shard = shard_in(plan, name);
    local[name] = part_of(t, shard, ranks_of(shard, tp, ep));
  }
  return local;
}

}  // namespace tessera::core
