// A run resolved once, in one place, from its spec, the command line and this process's place
// among the ranks: the YAML with includes, overrides and ${...} applied and the components the
// host adds by default, every fixed section read into its declared struct, the run context and
// the checkpoint folders. The plan is immutable; what runs the plan takes the parts it needs.
#pragma once

#include <string>
#include <vector>

#include "tessera/run/context.hpp"
#include "tessera/core/checkpoint/checkpoint_settings.hpp"
#include "tessera/core/checkpoint/checkpoint_store.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/run/parallelism_settings.hpp"
#include "tessera/core/run/run_settings.hpp"
#include "tessera/core/train/trainer_settings.hpp"

namespace tessera::core {

struct RunOptions {
  std::string config_path;
  std::vector<std::string> overrides;     // --set K=V
  std::vector<std::string> plugin_paths;  // --plugin-path DIR
  std::string run_dir;                    // --run-dir DIR
  std::string resume;                     // --resume auto|PATH ("" starts fresh)
  // `tessera eval`: no training step follows, so the trainer's own requirements (a pipeline's
  // micro-batches) are not checked.
  bool evaluate_only = false;
  // `tessera generate` and `tessera chat`: the spec needs only a model (and a tokenizer for
  // text); the trainer's other components may be there, and are not required.
  bool generate_only = false;
  // `tessera plan`: plan as one process, whatever torchrun's or Slurm's variables say.
  bool single_process = false;
};

struct RunPlan {
  std::string source;  // the spec file
  // The resolved spec, with the components the host adds: a jsonl_metrics callback when none
  // is listed (every run writes metrics.jsonl), and ddp when several ranks name no strategy.
  ConfigNode spec;
  std::string resolved_yaml;      // spec as YAML, written to RUN_DIR/config.yaml and into checkpoints
  std::string model_config_json;  // the model's component spec, next to model exports
  RunSettings settings;
  TrainerSettings trainer;
  CheckpointSettings checkpoint;
  ParallelismSettings parallelism;  // as written; context.parallel holds the resolved degrees
  CheckpointStore checkpoints;  // checkpoint.dir (default RUN_DIR/checkpoints) and RUN_DIR/exports
  std::vector<std::string> spec_plugin_paths;  // plugins.paths
  std::vector<std::string> cli_plugin_paths;   // --plugin-path
  DistributedEnv env;
  // Name, run directory, seed, device ("cuda" made cuda:LOCAL_RANK), rank, world size and the
  // mesh's degrees (parallel); the communicator and the mesh are made when the run starts.
  RunContext context;
  std::string strategy;  // the parallel variant, or "none" for one rank without one
  bool strategy_defaulted = false;  // components.parallel is the ddp the host added
  std::string resume;    // --resume

  const ConfigNode& components() const;
};

// Throws ConfigIssue (FILE:LINE:COL: PATH: message) on the first mistake in the spec's own
// sections; the components are validated against the loaded plugins afterwards.
RunPlan plan_run(const RunOptions& options, const DistributedEnv& env);

}  // namespace tessera::core
