// The degrees of a run's device mesh (spec section `parallelism:`), known before any process
// group exists: what validation checks components against (RunContext::parallel) and what the
// host builds the mesh from (tessera/parallel/device_mesh.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

// The mesh's axes, outer to inner.
enum class MeshAxis { pp, dp_replicate, dp_shard, cp, tp };

// The degrees of a mesh (`parallelism:` as the host resolved it: dp_shard -1 already replaced).
struct TESSERA_API ParallelDims {
  std::int64_t dp_replicate = 1;
  std::int64_t dp_shard = 1;
  std::int64_t tp = 1;
  std::int64_t cp = 1;
  std::int64_t pp = 1;
  std::int64_t ep = 1;
  bool sequence_parallel = false;
  std::string cp_type = "ring";  // how attention crosses context-parallel slices: ring or ulysses
  // Pipeline parallelism: the schedule (gpipe, 1f1b, interleaved_1f1b), the stages each pipeline
  // rank holds (interleaved: several, every pp-th), and where the blocks are cut (block indices
  // that begin a stage after the first; empty: balanced by block count).
  std::string pp_schedule = "1f1b";
  std::int64_t pp_stages_per_rank = 1;
  std::vector<std::int64_t> pp_split_points;

  std::int64_t size(MeshAxis axis) const;
  // Ranks in all: the product of the axes (ep borrows, it does not multiply).
  std::int64_t world_size() const;
  // The data-parallel ranks: dp_replicate x dp_shard.
  std::int64_t data_parallel() const { return dp_replicate * dp_shard; }
  // "dp_shard 2 x tp 2": the axes above 1, for messages and logs ("1 rank" when none).
  std::string describe() const;
};

TESSERA_API const char* axis_name(MeshAxis axis);

// The coordinate of global rank `rank` on `axis` of a mesh of `dims`.
TESSERA_API std::int64_t mesh_coordinate(const ParallelDims& dims, std::int64_t rank, MeshAxis axis);

}  // namespace tessera
