#include "tessera/parallel/pipeline_schedule.hpp"

#include <algorithm>

#include "tessera/error.hpp"

namespace tessera {

namespace {

using Kind = PipelineAction::Kind;

std::vector<PipelineAction> gpipe(std::int64_t rank, std::int64_t m) {
  std::vector<PipelineAction> out;
  for (std::int64_t i = 0; i < m; ++i) out.push_back({Kind::forward, rank, i});
  for (std::int64_t i = 0; i < m; ++i) out.push_back({Kind::backward, rank, i});
  return out;
}

std::vector<PipelineAction> one_f_one_b(std::int64_t pp, std::int64_t rank, std::int64_t m) {
  std::vector<PipelineAction> out;
  const std::int64_t warmup = std::min(pp - rank - 1, m);
  std::int64_t forward = 0, backward = 0;
  for (; forward < warmup; ++forward) out.push_back({Kind::forward, rank, forward});
  while (forward < m) {
    out.push_back({Kind::forward, rank, forward++});
    out.push_back({Kind::backward, rank, backward++});
  }
  while (backward < m) out.push_back({Kind::backward, rank, backward++});
  return out;
}

// Megatron-LM's interleaved schedule: virtual micro-batch k (of m v) is micro-batch
// (k / (pp v)) pp + k % pp on this rank's chunk (k / pp) % v, counted from the last chunk
// backwards for the backward passes.
std::vector<PipelineAction> interleaved(std::int64_t pp, std::int64_t v, std::int64_t rank, std::int64_t m) {
  if (m % pp != 0) {
    throw Error("pipeline: interleaved_1f1b runs micro-batches in groups of pp (" + std::to_string(pp) + "); " +
                std::to_string(m) + " is not a multiple");
  }
  const std::int64_t total = m * v;
  auto micro_batch = [&](std::int64_t k) { return (k / (pp * v)) * pp + k % pp; };
  auto stage = [&](std::int64_t k, bool forward) {
    const std::int64_t chunk = (k % (pp * v)) / pp;
    return (forward ? chunk : v - 1 - chunk) * pp + rank;
  };
  const std::int64_t warmup = std::min((pp - rank - 1) * 2 + (v - 1) * pp, total);
  std::vector<PipelineAction> out;
  std::int64_t forward = 0, backward = 0;
  for (; forward < warmup; ++forward) out.push_back({Kind::forward, stage(forward, true), micro_batch(forward)});
  while (forward < total) {
    out.push_back({Kind::forward, stage(forward, true), micro_batch(forward)});
    ++forward;
    out.push_back({Kind::backward, stage(backward, false), micro_batch(backward)});
    ++backward;
  }
  for (; backward < total; ++backward) out.push_back({Kind::backward, stage(backward, false), micro_batch(backward)});
  return out;
}

}  // namespace

std::vector<PipelineAction> pipeline_schedule(const std::string& schedule, std::int64_t pp,
                                              std::int64_t stages_per_rank, std::int64_t rank,
                                              std::int64_t micro_batches) {
  if (schedule == "gpipe") return gpipe(rank, micro_batches);
  if (schedule == "1f1b") return one_f_one_b(pp, rank, micro_batches);
  if (schedule == "interleaved_1f1b") return interleaved(pp, stages_per_rank, rank, micro_batches);
  throw Error("pipeline: no schedule " + schedule + " (gpipe, 1f1b, interleaved_1f1b)");
}

double pipeline_bubble(const std::string& schedule, std::int64_t pp, std::int64_t stages_per_rank,
                       std::int64_t micro_batches) {
  const double v = schedule == "interleaved_1f1b" ? static_cast<double>(stages_per_rank) : 1.0;
  return static_cast<double>(pp - 1) / (v * static_cast<double>(micro_batches) + static_cast<double>(pp - 1));
}

}  // namespace tessera
