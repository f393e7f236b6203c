// The output projection and cross-entropy together, a chunk of tokens at a time: each chunk's
// logits are made, turned into its summed loss and the gradient of that loss with respect to
// the chunk's hidden states and the projection, and dropped before the next chunk. Peak memory
// holds one chunk's [chunk, vocab] float32 logits instead of all tokens'. The gradients are
// finished in forward (as Liger-Kernel's fused linear cross-entropy does), so backward only
// scales them: no matrix product runs twice.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera_plugins {

// Summed cross-entropy of linear(hidden, weight, bias) against labels (ignore_index skipped),
// differentiable with respect to hidden, weight and bias. hidden [tokens, dim], labels [tokens].
// Under autocast the matrix products run in autocast's dtype, the softmax in float32.
at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                        const at::Tensor& labels, std::int64_t chunk_size, double label_smoothing,
                                        std::int64_t ignore_index);

}  // namespace tessera_plugins
