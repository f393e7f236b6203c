// Optimizer state saved under one layout of ranks, loaded under another. The convention
// (tessera/optimizer.hpp): keys "param.<i>.<field>" hold per-element state of parameter i
// (shaped like it, or 1-D over its part) or a 0-dim value (a step count).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/stateful.hpp"

namespace tessera::core {

// Joins the parts saved by several ranks (each with its "param.<i>" -> [begin, end, numel]
// ranges) into whole flattened tensors; the parts must tile every parameter exactly.
StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges);
// One rank's optimizer file: its state, the ranges it covers, and under tensor parallelism each
// parameter's layout ("param.<i>" -> tensor_parallel_layout(...)): which part of the whole
// parameter this rank's parameter i is.
struct OptimizerPart {
  StateDict state, ranges, layouts;
};
// int64 [tp_rank, tp_size, shard dim, blocks, local shape...]
at::Tensor tensor_parallel_layout(const TensorParallel& tp, const TensorShard& shard, at::IntArrayRef local_shape);
// The parts of every rank joined into the optimizer state of whole parameters (flattened): the
// parts of each tensor-parallel rank merged (merge_optimizer_parts), then those joined along each
// parameter's split. Parts without layouts are one tensor-parallel rank's (tp 1).
StateDict merge_optimizer_files(const std::vector<OptimizerPart>& parts);
// Whole optimizer state (as merge_optimizer_parts gives it) cut to this tensor-parallel rank's
// parts: parameter i's per-element state cut by shards[i] (its whole shape from params[i], this
// rank's part). Other tensors as they are.
StateDict tensor_parallel_part(const StateDict& whole, const std::vector<at::Tensor>& params,
                               const std::vector<TensorShard>& shards, const TensorParallel& tp);

// Cuts whole optimizer state for one rank: parameter i's elements [begin, end) when `ranges` is
// given (1-D), else the whole tensor shaped like parameter i.
StateDict optimizer_state_for(const StateDict& whole, const std::vector<at::Tensor>& params,
                              const std::vector<std::pair<std::int64_t, std::int64_t>>* ranges);

}  // namespace tessera::core
