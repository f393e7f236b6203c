// One run from its spec: resolve the YAML, read this process's rank from the environment, load
// the plugins, validate every component, then (for `train`) join the process group, seed, build,
// write the resolved config and run the loop. Teardown order is
// fixed: components, then the registry, then the plugin libraries.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/distributed.hpp"
#include "tessera/core/plugin_host.hpp"
#include "tessera/core/run_spec.hpp"
#include "tessera/core/trainer.hpp"

namespace tessera::core {

struct RunOptions {
  std::string config_path;
  std::vector<std::string> overrides;     // --set K=V
  std::vector<std::string> plugin_paths;  // --plugin-path DIR
  std::string run_dir;                    // --run-dir DIR
  std::string resume;                     // --resume auto|PATH ("" starts fresh)
};

class TrainingRun {
 public:
  // Loads and validates everything; builds nothing. Throws ConfigIssue or PluginLoadError.
  explicit TrainingRun(const RunOptions& options);

  const RunSpec& spec() const { return spec_; }
  const PluginHost& plugins() const { return host_; }

  // Builds the components, hands them to a Trainer (resumed when options asked for it, with
  // checkpoints enabled) and runs it to a stop condition.
  TrainResult train();
  // Builds the trainer without running it (tests drive single steps).
  std::unique_ptr<Trainer> make_trainer();

 private:
  // --resume auto: the newest valid checkpoint as rank 0 finds it ("" for none), on every rank.
  std::string agreed_resumable_checkpoint();

  RunSpec spec_;
  std::string resume_;
  DistributedEnv env_;
  PluginHost host_;
};

// Seeds every RNG the run may use from one seed; touches CUDA only for a cuda device.
void seed_everything(std::uint64_t seed, const std::string& device);

}  // namespace tessera::core
