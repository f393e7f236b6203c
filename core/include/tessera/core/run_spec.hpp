// The run spec: one YAML file (plus includes and --set overrides) that says everything about a
// run. This file reads its fixed sections (name, plugins, settings, trainer) and checks that the
// components the trainer needs are there; the components themselves belong to ComponentFactory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/context.hpp"
#include "tessera/core/config_tree.hpp"
#include "tessera/schema.hpp"

namespace tessera::core {

struct TrainerSettings {
  std::int64_t max_steps = 0;   // 0: no limit
  std::int64_t max_tokens = 0;  // input tokens, all ranks; 0: no limit
  double max_time_s = 0;        // wall-clock budget; 0: no limit
  std::int64_t grad_accum = 1;
  std::int64_t micro_batch_size = 1;
  double clip_grad_norm = 0;    // 0: no clipping (the norm is still measured)
  double peak_flops = 0;        // settings.peak_flops: one device's peak FLOP/s for MFU (0: table)
};

// The `checkpoint` section (docs/checkpointing.md).
struct CheckpointSettings {
  std::string dir;               // default RUN_DIR/checkpoints
  std::int64_t every_steps = 0;  // 0: only at the end and when a callback asks
  std::int64_t keep_last = 0;    // 0: keep all
  bool at_end = true;
  bool async = true;
  std::int64_t export_every_steps = 0;
  bool export_at_end = true;
};

struct RunSpec {
  ConfigNode root;  // fully resolved: includes merged, overrides applied, ${...} replaced
  std::string source;
  RunContext context;
  std::vector<std::string> plugin_paths;
  std::string log_level = "info";
  bool deterministic = false;
  std::int64_t num_threads = 0;
  double collective_timeout_s = 300;
  TrainerSettings trainer;
  CheckpointSettings checkpoint;

  const ConfigNode& components() const;
};

// The trainer's roles under `components`: name, kind, and whether it may be left out.
struct ComponentRole {
  const char* name;
  const char* kind;
  bool required;
  bool list;
  const char* doc;
};
const std::vector<ComponentRole>& trainer_roles();

Schema plugins_schema();
Schema settings_schema();
Schema trainer_schema();
Schema checkpoint_schema();

// Loads and resolves a run spec; throws ConfigIssue on the first mistake.
RunSpec load_run_spec(const std::string& path, const std::vector<std::string>& overrides,
                      const std::string& run_dir_override = {});

}  // namespace tessera::core
