// Checkpoints on disk (docs/checkpointing.md): the layout, writing one crash-safely from every
// rank, verifying one, finding the newest valid one, reading one back, and resharding optimizer
// state saved under one layout of ranks into another.
//
//   CHECKPOINT_DIR/
//     latest                       the name of the newest complete checkpoint
//     step_00001000/
//       metadata.json              format, versions, world size, strategy, progress, and the
//                                  size and CRC-32C of every file below
//       config.yaml                the resolved run spec
//       model.safetensors          the whole model (rank 0 writes it)
//       rank_00000/                one folder per rank
//         optimizer.safetensors    its optimizer state (only rank 0's when not sharded)
//         data.safetensors         its dataset position
//         rng.safetensors          its random generators
//         manifest.json            its files' sizes and checksums (written last)
//     step_00001000.tmp/           a save in progress (ignored, removed at the next start)
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessera/durable_file.hpp"
#include "tessera/error.hpp"
#include "tessera/stateful.hpp"

namespace tessera::core {

inline constexpr int kCheckpointFormatVersion = 1;

// A checkpoint that cannot be used: missing, incomplete, or corrupt.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// One rank's part of a checkpoint: host copies taken at a step boundary.
struct CheckpointState {
  std::int64_t step = 0, tokens = 0, samples = 0;
  double elapsed_s = 0;
  std::int64_t rank = 0, world_size = 1;
  std::string strategy = "none";
  StateDict model;                 // rank 0: every parameter and buffer, whole, by name
  bool write_optimizer = false;    // whether this rank writes optimizer state
  bool optimizer_sharded = false;  // whether each rank's optimizer state covers only its part
  StateDict optimizer;             // the optimizer's state_dict on this rank
  // "param.<i>" -> int64 [begin, end, numel]: the part of parameter i (flattened) it covers.
  StateDict optimizer_ranges;
  StateDict data;  // the dataset's state on this rank
  StateDict rng;   // this rank's generators
  std::string config_yaml;        // rank 0: the resolved spec
  std::string model_config_json;  // rank 0: the model's component spec, for exports
};

struct CheckpointMetadata {
  std::string path;
  int format_version = 0;
  std::string tessera_version;
  std::int64_t world_size = 0;
  std::string strategy;
  bool optimizer_sharded = false;
  std::int64_t step = 0, tokens = 0, samples = 0;
  double elapsed_s = 0;
  std::map<std::string, WrittenFile> files;  // relative path -> size and CRC-32C
};

std::string checkpoint_name(std::int64_t step);  // "step_00001000"
// The step a checkpoint folder's name stands for (verify_checkpoint checks that its metadata
// agrees), or -1 when the name is not one.
std::int64_t checkpoint_step(const std::string& path);

// Writes this rank's part of the checkpoint for state.step under `dir`. Rank 0 then waits (up to
// `timeout`) for every rank's manifest, writes metadata.json, renames the folder into place,
// points `latest` at it and removes the oldest checkpoints up to this step beyond `keep_last`
// (0: none).
// Returns false when a valid checkpoint of that step exists (nothing written); an invalid one is
// replaced.
bool write_checkpoint(const std::string& dir, const CheckpointState& state, std::int64_t keep_last,
                      std::chrono::milliseconds timeout);
// Rank 0: RUN_DIR/exports/step_N/{model.safetensors, config.json}, written then renamed.
void write_model_export(const std::string& exports_dir, const CheckpointState& state);

// Checks a checkpoint folder: metadata readable and of a known format, every listed file present
// with its size and CRC-32C. Throws CheckpointError saying what is wrong.
CheckpointMetadata verify_checkpoint(const std::string& path);
// The newest valid checkpoint under `dir` (by step; `latest` names the newest complete one unless
// a crash came between a rename and its update), logging every invalid one it skips; "" when
// there is none.
std::string find_resumable_checkpoint(const std::string& dir);
// Removes folders of saves that never completed (*.tmp).
void remove_incomplete_checkpoints(const std::string& dir);
// A run resumed at `step` continues a different history than the checkpoints after it: those are
// renamed to step_N.superseded (kept for the user, never resumed from or pruned).
void supersede_checkpoints_after(const std::string& dir, std::int64_t step);

struct LoadedCheckpoint {
  CheckpointMetadata metadata;
  StateDict model;
  // The optimizer state as one rank would hold it with no sharding: per-parameter tensors
  // ("param.<i>.<field>") whole but flattened; others as saved.
  StateDict optimizer;
  StateDict data;  // this rank's if it was saved, else rank 0's
  StateDict rng;   // this rank's if it was saved, else empty
};
// Verifies, then reads what `rank` needs. Every rank reads every optimizer file when the state
// was sharded, so any number of ranks can resume from any other.
LoadedCheckpoint read_checkpoint(const std::string& path, std::int64_t rank);

// Optimizer state convention (tessera/optimizer.hpp): keys "param.<i>.<field>" hold per-element
// state of parameter i (shaped like it, or 1-D over its part) or a 0-dim value (a step count).
// Joins the parts saved by several ranks into whole flattened tensors.
StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges);
// Cuts whole optimizer state for one rank: parameter i's elements [begin, end) when `ranges` is
// given (1-D), else the whole tensor shaped like parameter i.
StateDict optimizer_state_for(const StateDict& whole, const std::vector<at::Tensor>& params,
                              const std::vector<std::pair<std::int64_t, std::int64_t>>* ranges);

}  // namespace tessera::core
