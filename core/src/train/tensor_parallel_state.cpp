#include "tessera/core/train/tensor_parallel_state.hpp"

#include <ATen/ops/empty_like.h>

#include <vector>

namespace tessera::core {

StateDict join_tensor_parallel(const StateDict& local, const TensorParallelPlan& plan, const TensorParallel& tp) {
  if (tp.size() == 1) return local;
  // The parts travel to tensor-parallel rank 0 alone, one parameter at a time: no rank ever holds
  // more than the whole model once (rank 0) or its own part (the others).
  const bool keeper = tp.rank() == 0;
  Communicator& group = *tp.group();
  StateDict whole;
  for (const auto& [name, part] : local) {  // in name order, the same on every rank
    const TensorShard shard = shard_in(plan, name);
    if (shard.replicated()) {
      if (keeper) whole[name] = part;
      continue;
    }
    at::Tensor mine = part.contiguous();
    if (!keeper) {
      group.send_async(mine, 0)->wait();
      continue;
    }
    std::vector<at::Tensor> parts{mine};
    for (std::int64_t r = 1; r < tp.size(); ++r) {
      parts.push_back(at::empty_like(mine));
      group.recv_async(parts.back(), r)->wait();
    }
    whole[name] = TensorParallel::join(parts, shard);
  }
  return whole;
}

StateDict cut_tensor_parallel(const StateDict& whole, const TensorParallelPlan& plan, const TensorParallel& tp) {
  if (tp.size() == 1) return whole;
  StateDict local;
  for (const auto& [name, t] : whole) local[name] = tp.part_of(t, shard_in(plan, name));
  return local;
}

}  // namespace tessera::core
