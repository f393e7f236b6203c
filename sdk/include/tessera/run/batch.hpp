// One micro-batch of token sequences. Labels equal to kIgnoreIndex contribute no loss; the count
// of the others is known on the host without touching the device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera {

inline constexpr std::int64_t kIgnoreIndex = -100;

struct Batch {
  at::Tensor input_ids;  // [batch, seq_len] int64
  at::Tensor labels;     // [batch, seq_len] int64, kIgnoreIndex where no loss is taken
  std::int64_t num_target_tokens = 0;  // labels != kIgnoreIndex, counted on the host
  // Optional, [batch, seq_len] int64: the document each position belongs to, where a row packs
  // several (dataset/tokens with document_mask, packed SFT examples). A model that
  // masks_documents() attends only within a document and counts positions from its start.
  at::Tensor document_ids;
};

}  // namespace tessera
