// The output projection and cross-entropy together, a chunk of tokens at a time: each chunk's
// logits are made, turned into its summed loss and the gradient of that loss with respect to
// the chunk's hidden states and the projection, and dropped before the next chunk. Peak memory
// holds one chunk's [chunk, vocab] float32 logits instead of all tokens'. The gradients are
// finished in forward (as Liger-Kernel's fused linear cross-entropy does), so backward only
// scales them: no matrix product runs twice.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "tessera/components/output_head.hpp"

namespace tessera_plugins {

// Summed cross-entropy of linear(hidden, head.weight, head.bias) against labels (ignore_index
// skipped), differentiable with respect to hidden, weight and bias. hidden [tokens, dim], labels
// [tokens]. Under autocast the matrix products run in autocast's dtype, the softmax in float32.
// With a vocabulary-parallel head (OutputHead::vocab_parallel) each rank projects onto its rows
// of the vocabulary and the chunk's loss is reduced over the head's group
// (tessera/parallel/vocab_parallel.hpp): no rank holds a token's whole logits; the gradient of
// `hidden` is then this rank's part of it, which the model's column_input sums over the ranks.
at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const tessera::OutputHead& head,
                                        const at::Tensor& labels, std::int64_t chunk_size, double label_smoothing,
                                        std::int64_t ignore_index);

}  // namespace tessera_plugins
