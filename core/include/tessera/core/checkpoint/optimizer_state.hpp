// An optimizer's state in checkpoints, by its parameters' placements: which rank writes which
// part (one writer per distinct part), with each part's name, range and layout; and the whole
// state a checkpoint holds cut back to this rank's parts under any mesh and strategy.
#pragma once

#include <string>
#include <vector>

#include "tessera/components/optimizer.hpp"
#include "tessera/components/strategy.hpp"
#include "tessera/core/checkpoint/checkpoint_state.hpp"
#include "tessera/parallel/optimizer_placements.hpp"

namespace tessera::core {

// The optimizer of a run and where its parameters live.
struct PlacedOptimizer {
  Optimizer& optimizer;
  ParallelStrategy& strategy;        // whether it shards the state; runs the load on this rank's shares
  const OptimizerPlacements& placed; // each optimizer parameter's name and placement, in order
};

// Fills `st`'s optimizer fields with this rank's share (write_optimizer false when it writes none).
void capture_optimizer_state(CheckpointState& st, const PlacedOptimizer& o);
// Loads the whole state `whole` (keyed by `saved_names`' indices where the checkpoint has names,
// else by the saving optimizer's own; merge_optimizer_files gives it) into this rank's optimizer.
// Errors name `checkpoint_path`; `model` names the model in them.
void restore_optimizer_state(StateDict whole, const std::vector<std::string>& saved_names, const PlacedOptimizer& o,
                             bool pipeline, const std::string& checkpoint_path, const std::string& model);

}  // namespace tessera::core
