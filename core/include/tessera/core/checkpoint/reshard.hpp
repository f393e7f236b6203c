// Optimizer state saved under one layout of ranks, loaded under another. The convention
// (tessera/components/optimizer.hpp): keys "param.<i>.<field>" hold per-element state of parameter i
// (shaped like it, or 1-D over its part) or a 0-dim value (a step count).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <string>
#include <vector>

#include "tessera/parallel/placement.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera::core {

// The index i of a per-parameter key "param.<i>.<field>", or -1 for any other key.
long long optimizer_param_index(const std::string& key);

// Joins the parts saved by several ranks (each with its "param.<i>" -> [begin, end, numel]
// ranges) into whole flattened tensors; the parts must tile every parameter exactly.
StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges);
// One rank's optimizer file: its state, the ranges it covers, and under tensor or expert
// parallelism each parameter's layout ("param.<i>" -> tessera::layout_of(...)): which part of the
// whole parameter this rank's parameter i is.
struct OptimizerPart {
  StateDict state, ranges, layouts;
  std::map<std::string, std::string> names;  // "param.<i>" -> parameter name (absent in older files)
};
// Renumbers every part's "param.<i>" keys (state, ranges, layouts) by the index of the
// parameter's name in the sorted names of all parts, which it returns; parts written by
// different pipeline stages number their parameters independently. Parts without names (older
// checkpoints) are left as they are, and the result is empty.
std::vector<std::string> key_parts_by_name(std::vector<OptimizerPart>& parts);
// The whole optimizer state keyed by `names` (key_parts_by_name's) re-keyed to the indices of
// `params_names` (this run's optimizer's parameters' names, in order): the state of parameters
// this run does not hold (another pipeline stage's) dropped. Throws CheckpointError naming a
// parameter the checkpoint has no state for.
StateDict optimizer_state_by_index(const StateDict& by_name_index, const std::vector<std::string>& names,
                                   const std::vector<std::string>& params_names);
// The parts of every rank joined into the optimizer state of whole parameters (flattened), each
// parameter's pieces by their ranges and layouts (tessera::join_saved_shares). A parameter
// without layouts is whole on every rank.
StateDict merge_optimizer_files(const std::vector<OptimizerPart>& parts);
// Whole optimizer state (as merge_optimizer_files gives it) cut to this rank's parts: parameter
// i's per-element state cut as placements[i] cuts the parameter (tessera::part_of_whole). Other
// tensors as they are.
StateDict shard_part(const StateDict& whole, const std::vector<Placement>& placements);

// Cuts whole optimizer state for one rank: parameter i's elements [begin, end) when `ranges` is
// given (1-D), else the whole tensor shaped like parameter i.
StateDict optimizer_state_for(const StateDict& whole, const std::vector<at::Tensor>& params,
                              const std::vector<std::pair<std::int64_t, std::int64_t>>* ranges);

}  // namespace tessera::core
