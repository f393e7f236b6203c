// `tessera plan SPEC --ranks N`: the meshes a spec can run on over N ranks, and for each what one
// rank holds (parameters, gradients, optimizer state, activations), the bytes each group of the
// mesh moves per step and the pipeline's bubble, computed without running a step: the spec's
// model is built on the meta device under each mesh (its real shapes per rank, no memory), the
// strategies' and model-parallel collectives are counted by the formulas of communication_plan.cpp,
// and every candidate mesh passes the checks `tessera validate` makes.
//
// Byte conventions are the ones the trainer measures (Communicator::bytes_communicated: an
// all-reduce's buffer, an all-gather's whole output, a reduce-scatter's whole input, each
// transfer at both ends), so a plan can be checked against a run's metrics (parameter_bytes,
// gradient_bytes, optimizer_bytes, communicated_bytes[/GROUP]); tests/integration/plan_test.cpp does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/run/run_plan.hpp"
#include "tessera/run/parallel_dims.hpp"

namespace tessera::core {

// What one rank holds, in bytes.
struct PlannedMemory {
  double parameters = 0;
  double gradients = 0;        // during the step (the local strategy frees them between steps)
  double optimizer_state = 0;
  double activations = 0;      // the step's peak: analytic (activation_plan.cpp)
  // loss/dpo's frozen copy of the starting weights (without adapters), held as the parameters are.
  double reference = 0;
  double total() const { return parameters + reference + gradients + optimizer_state + activations; }
};

// One pipeline stage's rank (the rank with every other coordinate 0); a mesh without pp has one.
struct PlannedRank {
  std::int64_t rank = 0;
  PlannedMemory memory;
  // Bytes this rank's collectives and transfers count per step, by group as the metrics name
  // them ("world", "tp", "dp_shard", "pp_gradients", ...), and their sum.
  std::map<std::string, double> communicated;
  double communicated_total() const;
};

struct PlannedMesh {
  ParallelDims dims;
  std::string strategy;            // parallel/ddp, parallel/fsdp, ... ("local" without one)
  std::vector<PlannedRank> ranks;  // by pipeline stage
  double bubble = 0;               // an ideal pipeline's idle share
  bool fits = true;                // the largest rank's total within --device-memory
  bool spec_mesh = false;          // the spec's own parallelism: section, for this many ranks
  // Each figure's maximum over the ranks (as the memory metrics are measured), and the largest
  // rank's total (what must fit a device).
  PlannedMemory largest() const;
  double largest_total() const;
  double largest_communicated() const;
};

// The most ranks a plan enumerates meshes for.
inline constexpr std::int64_t kMaxPlannedRanks = std::int64_t{1} << 20;

struct PlanRequest {
  RunOptions run;              // the spec, --set overrides, plugin paths
  std::int64_t ranks = 1;
  double device_memory_bytes = 0;  // 0: not given (every mesh fits)
};

struct PlanResult {
  std::vector<PlannedMesh> meshes;     // valid ones, best first (rank_meshes)
  std::vector<std::string> rejected;   // "tp 4: <why validate refuses it>", one per candidate
  std::string model;                   // model/gpt (components.model), for the report
  bool model_describes_shape = false;  // Model::transformer_shape given: model-parallel traffic planned
};

// Plans every candidate mesh of request.ranks ranks. Throws ConfigIssue for a spec that does not
// validate at all.
PlanResult plan_meshes(const PlanRequest& request);

// Every factorisation of `ranks` into pp x dp_replicate x dp_shard x cp x tp (and ep dividing
// dp_shard, sequence_parallel on or off with tp) that the model's axes allow, with the spec's
// schedule, split points and cp_type. dp_replicate > 1 only for fsdp (hybrid sharding; the other
// strategies treat it as dp_shard).
std::vector<ParallelDims> candidate_meshes(std::int64_t ranks, const ParallelDims& spec,
                                           const std::vector<std::string>& model_axes, bool hybrid_sharding);

// Best first: meshes that fit, then the smaller bubble, then fewer bytes moved per step by the
// busiest rank, then less memory.
void rank_meshes(std::vector<PlannedMesh>& meshes);

}  // namespace tessera::core
