// A step's micro-batches and their token counts, and a rollout's (trainer_step.cpp draws them; the step's schedule,
// core/src/schedule's local_schedule.cpp or pipeline_step.cpp, runs them). Private to the trainer's sources.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tessera/run/batch.hpp"
#include "tessera/core/train/trainer.hpp"

namespace tessera::core {

struct Trainer::StepInputs {
  std::vector<Batch> micro_batches;
  // Over all ranks: the loss divisor, the throughput's tokens, the samples counted in progress.
  std::int64_t target_tokens = 0, input_tokens = 0, samples = 0;
  std::int64_t seq_len = 0;  // the longest micro-batch's, for the model's FLOPs per token
  // Counts `batch` (this rank's, until summed over ranks: Trainer::sum_over_ranks).
  void count(const Batch& batch) {
    target_tokens += batch.num_target_tokens;
    input_tokens += batch.input_ids.numel();
    samples += batch.input_ids.size(0);
    seq_len = std::max<std::int64_t>(seq_len, batch.input_ids.size(-1));
  }
  // 1 / target_tokens: every micro-batch's summed loss is scaled by it.
  double inv_tokens() const { return 1.0 / static_cast<double>(std::max<std::int64_t>(target_tokens, 1)); }
};

// A rollout's micro-batches (trainer_rollout.cpp) and each one's rows for the loss.
struct Trainer::Rollout {
  std::vector<Batch> micro_batches;
  std::vector<RolloutRows> rows;
};

}  // namespace tessera::core
