// The `parallelism` section of a run spec (docs/distributed.md): the device mesh's degrees. The
// `parallel` component (ddp, zero1, zero2, fsdp) is the data-parallel strategy over the
// dp_replicate x dp_shard ranks (and their cp peers); tp (with sequence_parallel) splits the
// model's layers, cp (ring or ulysses attention) every sequence, pp its blocks into pipeline
// stages, ep the experts of its mixture-of-experts layers. Declared
// once (tessera/config/config_fields.hpp); resolved against the world size into ParallelDims.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config/config_fields.hpp"
#include "tessera/run/parallel_dims.hpp"

namespace tessera::core {

struct ParallelismSettings {
  std::int64_t dp_replicate = 1;
  std::int64_t dp_shard = -1;  // -1: the ranks the other axes leave
  std::int64_t tp = 1;
  std::int64_t cp = 1;
  std::int64_t pp = 1;
  std::int64_t ep = 1;
  bool sequence_parallel = false;
  std::string cp_type = "ring";
  std::string pp_schedule = "1f1b";
  std::int64_t pp_stages_per_rank = 0;  // 0: 2 for interleaved_1f1b, else 1
  std::vector<std::int64_t> pp_split_points;

  static void declare(ConfigFields<ParallelismSettings>& f);
};

// The mesh of `world_size` ranks these settings describe: dp_shard -1 becomes the ranks left.
// Throws ConfigError naming the field for a product that is not the world size, or an axis this
// Tessera does not split over yet. `launched`: whether world_size is the real number of ranks
// (tessera validate of a spec for several ranks runs alone: its dp_shard -1 becomes 1 and the
// product is not checked).
ParallelDims resolve_parallel_dims(const ParallelismSettings& settings, std::int64_t world_size, bool launched);

}  // namespace tessera::core
