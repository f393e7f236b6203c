// Optimizer state saved under one layout of ranks, loaded under another. The convention
// (tessera/optimizer.hpp): keys "param.<i>.<field>" hold per-element state of parameter i
// (shaped like it, or 1-D over its part) or a 0-dim value (a step count).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "tessera/stateful.hpp"

namespace tessera::core {

// Joins the parts saved by several ranks (each with its "param.<i>" -> [begin, end, numel]
// ranges) into whole flattened tensors; the parts must tile every parameter exactly.
StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges);
// Cuts whole optimizer state for one rank: parameter i's elements [begin, end) when `ranges` is
// given (1-D), else the whole tensor shaped like parameter i.
StateDict optimizer_state_for(const StateDict& whole, const std::vector<at::Tensor>& params,
                              const std::vector<std::pair<std::int64_t, std::int64_t>>* ranges);

}  // namespace tessera::core
