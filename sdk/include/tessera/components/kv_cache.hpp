// The keys and values a decoder computed for a batch of sequences, kept between forward passes so
// that each new token attends to the past without recomputing it: generation's prefill (the
// prompts in one pass) and decode (one token a pass). Model::decode reads and extends it; the
// model stays a pure function of (tokens, positions, cache).
//
// Slots, not positions: every sequence of the batch writes the same slots in a pass, and each
// slot records the position of its key (-1: none, as in a shorter prompt's left padding). Which
// keys a query sees follows from the positions alone (causal, within a sliding window), so prompts
// of different lengths share one batch and one pass. Each attention layer keeps its own tensors
// (this rank's key/value heads under tensor parallelism; a latent attention its compressed
// latent and rotary key), allocated at its first write in the dtype and device of what it writes.
//
// The model's weights stay fixed while a cache is decoded with (one generation call), so a layer
// may also keep tensors made from its weights for the cache's life (derived: its projections side
// by side, made once and read by every decode step).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

class TESSERA_API KvCache {
 public:
  // `layers`: the model's attention layers (Model::transformer_shape().blocks for a kit model).
  KvCache(std::int64_t batch, std::int64_t capacity, std::size_t layers, c10::Device device);

  std::int64_t batch() const { return batch_; }
  std::int64_t capacity() const { return capacity_; }
  // Slots written by the passes that ended.
  std::int64_t length() const { return length_; }
  // [batch, capacity] int64: the position of each slot's key; -1 where there is none.
  const at::Tensor& key_positions() const { return key_positions_; }

  // --- One forward pass (the model's) -------------------------------------------------------------
  // Starts a pass writing positions.size(1) slots from length(), at `positions` ([batch, n]
  // int64, -1 for padding). Refuses a pass past capacity or of another batch.
  void begin_pass(const at::Tensor& positions);
  // This pass' positions with padding at 0: what rotary tables and position embeddings read.
  at::Tensor pass_positions() const;
  // Writes this pass' tensors of `layer` (each [batch, heads, n, dim]) at its slots and returns
  // that layer's tensors of every slot so far, [batch, heads, length() + n, dim] each.
  std::vector<at::Tensor> append(std::size_t layer, const std::vector<at::Tensor>& tensors);
  // [batch, 1, n, length() + n] bool: the keys each query of this pass sees: those with a
  // position at most its own, and more than `window` before it when window > 0. A padding query
  // sees every key (its output is never read; a row with none would be NaN). Undefined when every
  // query sees every key: one query a row, no slot ever padded, no window reaching back past the
  // first slot (a decode step of equal prompts: attention without a mask).
  at::Tensor visible(std::int64_t window = 0) const;
  // Ends the pass: length() grows by its slots.
  void end_pass();
  // Abandons the pass (a forward that threw): its slots hold no key again, length() as it was.
  void abandon_pass();

  // Bytes of every layer's keys and values (what the cache holds on the device; derived tensors
  // are not counted).
  std::int64_t bytes() const;

  // `layer`'s tensor `name`, made by `make` at the first call and kept for the cache's life: what a
  // layer makes from its weights once for every pass (they stay fixed while the cache is used).
  // Returned by value: a later call may move what the cache keeps.
  at::Tensor derived(std::size_t layer, const std::string& name, const std::function<at::Tensor()>& make);

 private:
  std::int64_t batch_, capacity_, length_ = 0;
  bool padded_ = false;  // some slot holds no key (left padding); known when positions come from the host
  c10::Device device_;
  at::Tensor key_positions_;
  at::Tensor pass_;  // this pass' positions; undefined between passes
  // This pass' visible() masks by window: every layer of a window reads the same one.
  mutable std::vector<std::pair<std::int64_t, at::Tensor>> visible_;
  std::vector<std::vector<at::Tensor>> layers_;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> derived_;
};

}  // namespace tessera
