// Kind `dataset`: yields micro-batches in a deterministic, seeded order. Its position is state,
// so a resumed run reads exactly the samples it would have read.
#pragma once

#include <cstdint>

#include "tessera/run/batch.hpp"
#include "tessera/export.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

class PromptSource;

class TESSERA_API Dataset : public Stateful {
 public:
  static constexpr const char* kKind = "dataset";
  ~Dataset() override;

  // Restricts this process to its share of the samples: rank r of world_size reads a disjoint
  // subset. Called once before the first batch.
  virtual void set_shard(std::int64_t rank, std::int64_t world_size) = 0;
  // The next `batch_size` samples of this shard, on the CPU. Never runs out: a new epoch begins
  // with a new seeded order.
  virtual Batch next_batch(std::int64_t batch_size) = 0;
  virtual std::int64_t seq_len() const = 0;
  // Samples in one epoch of the whole dataset (all shards together).
  virtual std::int64_t num_samples() const = 0;
  // A dataset of prompts for reinforcement learning (tessera/components/prompt_source.hpp) gives
  // them here, and itself; a dataset of token sequences gives null (the default).
  virtual PromptSource* prompts() { return nullptr; }
};

}  // namespace tessera
