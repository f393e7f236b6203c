// What a checkpoint holds, in memory: one rank's part as the trainer captures it, the metadata a
// complete checkpoint carries, and what a rank reads back to resume.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "tessera/formats/durable_file.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/run/stateful.hpp"

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
  // Rank 0: a loss's reference model when the run holds it as a frozen copy (loss/dpo without
  // adapters): every parameter, whole, by name. Empty otherwise.
  StateDict reference;
  bool write_optimizer = false;    // whether this rank writes optimizer state
  bool optimizer_sharded = false;  // whether each rank's optimizer state covers only its part
  // The optimizer's state_dict on this rank: the per-parameter entries of the parameters it
  // writes (another rank may write others, e.g. each expert-parallel rank its experts'), and the
  // rest.
  StateDict optimizer;
  // "param.<i>" -> int64 [begin, end, numel]: the part of parameter i (flattened) it covers.
  StateDict optimizer_ranges;
  // Under tensor or expert parallelism, "param.<i>" -> which part of the whole parameter i is
  // (tessera::layout_of, tessera/parallel/saved_shares.hpp); empty otherwise.
  StateDict optimizer_layouts;
  // "param.<i>" -> the model's name of parameter i: how a run that numbers its optimizer's
  // parameters otherwise (another pipeline split) finds each one's state.
  std::map<std::string, std::string> optimizer_names;
  std::string mesh = "1 rank";  // the run's device mesh, ParallelDims::describe()
  StateDict data;  // the dataset's state on this rank
  StateDict rng;   // this rank's generators
  std::string config_yaml;        // rank 0: the resolved spec
  std::string model_config_json;  // rank 0: the model's component spec, for exports
  // Rank 0, for an export in Hugging Face format: the model's folder contents, converted from
  // `model` by the model at the step (the writer may run after the model has moved on).
  std::shared_ptr<const HfExport> hf_export;
  // Rank 0, for an export in PEFT format: the adapter folder's contents.
  std::shared_ptr<const PeftExport> peft_export;
  // Rank 0, for an export in Tessera's format of a run with adapters: the names of `model`'s
  // tensors that are the adapters' (written apart from the base, in adapters.safetensors).
  std::set<std::string> adapter_tensors;
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

struct LoadedCheckpoint {
  CheckpointMetadata metadata;
  StateDict model;
  StateDict reference;  // reference.safetensors where the checkpoint has one
  // The optimizer state as one rank would hold it with no sharding: per-parameter tensors
  // ("param.<i>.<field>") whole but flattened; others as saved.
  StateDict optimizer;
  // With the checkpoint's parameter names (written since pipeline parallelism): i above is the
  // index of the parameter's name here, and the optimizer state is every saved parameter's. Empty
  // (an older checkpoint): i is the saving optimizer's own index.
  std::vector<std::string> optimizer_names;
  StateDict data;  // this rank's if it was saved, else rank 0's
  StateDict rng;   // this rank's if it was saved, else rank 0's
};

}  // namespace tessera::core
