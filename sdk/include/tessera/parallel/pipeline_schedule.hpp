// The order in which a pipeline rank runs its stages' forward and backward passes over a step's
// micro-batches (parallelism.pp_schedule), and the idle share an ideal pipeline has:
//   gpipe             every forward, then every backward (m micro-batches' activations held);
//   1f1b              pp - rank - 1 forwards to fill the pipeline, then one forward and one
//                     backward in turn, then the remaining backwards (at most pp held);
//   interleaved_1f1b  Megatron-LM's: each rank holds v stages (every pp-th), micro-batches go
//                     through them in groups of pp, which shrinks the bubble by v.
// Each stage's receive blocks until its input arrives and every send returns at once, so a
// schedule runs when every rank's order is consistent with the data's flow
// (PipelineSchedule.EveryScheduleRunsToTheEnd simulates that).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

struct PipelineAction {
  enum class Kind { forward, backward };
  Kind kind = Kind::forward;
  std::int64_t stage = 0;        // global stage index
  std::int64_t micro_batch = 0;  // 0 .. micro_batches - 1
};

// Pipeline rank `rank`'s actions, in order, for `micro_batches` micro-batches over `pp` ranks of
// `stages_per_rank` stages each (stage s on rank s % pp). Throws tessera::Error for a schedule it
// does not know, or interleaved_1f1b with micro-batches that are not a multiple of pp.
TESSERA_API std::vector<PipelineAction> pipeline_schedule(const std::string& schedule, std::int64_t pp,
                                                          std::int64_t stages_per_rank, std::int64_t rank,
                                                          std::int64_t micro_batches);

// The share of a step an ideal pipeline of equal stages spends idle: (pp - 1) / (m + pp - 1),
// interleaved (pp - 1) / (v m + pp - 1).
TESSERA_API double pipeline_bubble(const std::string& schedule, std::int64_t pp, std::int64_t stages_per_rank,
                                   std::int64_t micro_batches);

}  // namespace tessera
