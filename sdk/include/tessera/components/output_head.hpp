// The output projection of a language model: logits = hidden · weightᵀ + bias. A model that
// exposes it (Model::output_head) lets a loss compute logits a chunk of tokens at a time, so
// the whole [tokens, vocab] logits never exist at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "tessera/export.hpp"
#include "tessera/run/communicator.hpp"

namespace tessera {

struct OutputHead {
  at::Tensor weight;  // [vocab, hidden]: this rank's rows of it under tensor parallelism
  at::Tensor bias;    // [vocab] (this rank's part), or undefined
  // Set when the vocabulary is split over tensor-parallel ranks (vocab_parallel()): this rank
  // holds rows [vocab_start, vocab_start + weight.size(0)), and a loss reduces over `vocab_group`
  // (tessera/parallel/vocab_parallel.hpp) instead of gathering whole logits.
  std::shared_ptr<Communicator> vocab_group;
  std::int64_t vocab_start = 0;
  // The true vocabulary (0: weight's rows, whole). A padded head (TensorParallel::vocab_rows)
  // holds rows at or past it: their logits take no probability and no loss, a gathered
  // logits tensor drops them (real_logits()).
  std::int64_t vocab_size = 0;

  // Gemma 2's final_logit_softcapping: logits become cap · tanh(logits / cap). 0: none.
  double logit_softcap = 0.0;

  bool vocab_parallel() const { return vocab_group && vocab_group->world_size() > 1; }
  // This rank's logits of `hidden`: hidden · weightᵀ + bias, softcapped where the head is.
  TESSERA_API at::Tensor logits(const at::Tensor& hidden) const;
  // Whole logits (gathered over the ranks, or of a head that is not split) less the padding.
  at::Tensor real_logits(const at::Tensor& whole_logits) const {
    return vocab_size > 0 && whole_logits.size(-1) > vocab_size ? whole_logits.narrow(-1, 0, vocab_size) : whole_logits;
  }
};

// cap · tanh(logits / cap); `logits` itself when cap is 0.
TESSERA_API at::Tensor softcapped(const at::Tensor& logits, double cap);

}  // namespace tessera
