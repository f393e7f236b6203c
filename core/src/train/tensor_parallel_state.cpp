#include "tessera/core/train/tensor_parallel_state.hpp"

#include <ATen/ops/empty_like.h>

#include <vector>

namespace tessera::core {

StateDict join_tensor_parallel(const StateDict& local, const TensorParallelPlan& plan, const TensorParallel& tp) {
  if (tp.size() == 1) return local;
  StateDict whole;
  for (const auto& [name, part] : local) {  // in name order, the same on every rank
    const TensorShard shard = shard_in(plan, name);
    if (shard.replicated()) {
      whole[name] = part;
      continue;
    }
    const at::Tensor mine = part.contiguous();
    std::vector<at::Tensor> parts;
    for (std::int64_t r = 0; r < tp.size(); ++r) parts.push_back(at::empty_like(mine));
    tp.group()->all_gather(parts, mine);
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
