// What a component may know about the run it is part of.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "tessera/run/parallel_dims.hpp"

namespace tessera {

class Communicator;
class DeviceMesh;

struct RunContext {
  std::string name;      // the run's name (spec key `name`)
  std::string run_dir;   // where the run writes its files
  std::uint64_t seed = 0;  // the one seed every RNG derives from
  std::string device = "cpu";  // "cpu" or "cuda:N"
  // settings.precision: "fp32", or "bf16" (forward and backward compute in bfloat16 under
  // autocast; parameters, gradients and optimizer state stay float32). See tessera/run/precision.hpp.
  std::string precision = "fp32";
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  // The other ranks (tessera/run/communicator.hpp); set by the host for every run, also of one rank.
  std::shared_ptr<Communicator> communicator;
  // The run's `parallelism:` degrees: known when a spec is validated, before any process group.
  ParallelDims parallel;
  // The device mesh over those degrees (tessera/parallel/device_mesh.hpp): this rank's groups.
  // Set by the host when the run starts (null while a spec is only validated).
  std::shared_ptr<const DeviceMesh> mesh;
};

// Where a component's output path lands: relative paths are inside the run directory.
inline std::filesystem::path in_run_dir(const RunContext& run, const std::filesystem::path& path) {
  return path.is_relative() && !run.run_dir.empty() ? std::filesystem::path(run.run_dir) / path : path;
}

}  // namespace tessera
