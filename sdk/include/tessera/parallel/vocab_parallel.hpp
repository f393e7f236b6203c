// Cross-entropy over logits split along the vocabulary (Megatron-LM's vocab-parallel
// cross-entropy): each rank holds its columns [vocab_start, vocab_start + logits.size(-1)) of
// every token's logits; the softmax's maximum and normaliser and the label's logit are reduced
// over the group as one number per token, so no rank ever holds a token's whole logits. A loss
// plugin calls it chunk by chunk (plugins/losses/cross_entropy).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "tessera/run/communicator.hpp"
#include "tessera/export.hpp"

namespace tessera {

struct VocabParallelCrossEntropy {
  at::Tensor sum;          // float32 scalar: the summed loss of the tokens with a label
  at::Tensor grad_logits;  // float32 [tokens, local vocab]: d sum / d logits (when asked)
};

// logits [tokens, local vocab] (any float dtype; computed in float32), labels [tokens] int64
// with `ignore_index` where no loss is taken. `label_smoothing` spreads that mass uniformly over
// the whole vocabulary (`vocab_size` columns in all), as at::cross_entropy_loss does. Columns at
// or past `vocab_size` (a padded vocabulary's, TensorParallel::vocab_rows) take no probability
// and get a zero gradient. A collective: every rank of `group` calls it with its columns of the
// same tokens.
TESSERA_API VocabParallelCrossEntropy vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                                                   std::int64_t vocab_start, std::int64_t vocab_size,
                                                                   Communicator& group, double label_smoothing,
                                                                   std::int64_t ignore_index, bool with_grad);

}  // namespace tessera
