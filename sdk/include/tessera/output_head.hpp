// The output projection of a language model: logits = hidden · weightᵀ + bias. A model that
// exposes it (Model::output_head) lets a loss compute logits a chunk of tokens at a time, so
// the whole [tokens, vocab] logits never exist at once.
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera {

struct OutputHead {
  at::Tensor weight;  // [vocab, hidden]
  at::Tensor bias;    // [vocab], or undefined
};

}  // namespace tessera
