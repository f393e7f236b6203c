// Packed documents for kit models (DecoderModel computes this for every forward pass): from
// Batch::document_ids, each position's index within its document (learned positions and rotary
// angles restart at every document) and the attention mask that keeps every token causal within
// its own document.
#pragma once

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cummax.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include "tessera/error.hpp"

namespace tessera::documents {

struct Layout {
  at::Tensor positions;       // [batch, seq] int64: the index within the document
  at::Tensor attention_mask;  // [batch, 1, seq, seq] bool: true where attending is allowed
};

// `with_mask` false: positions alone (context-parallel attention builds its own masks from the
// document ids, chunk by chunk, and never needs the [seq, seq] mask).
inline Layout layout(const at::Tensor& document_ids, const at::Tensor& input_ids, bool with_mask = true) {
  if (document_ids.sizes() != input_ids.sizes()) {
    throw Error("document_ids must have the shape of input_ids [batch, seq]");
  }
  const at::Tensor docs = document_ids.to(input_ids.device(), at::kLong);
  const std::int64_t seq = docs.size(1);
  const at::Tensor index = at::arange(seq, docs.options()).expand_as(docs);
  // A document starts where the id changes (and at 0); each position's start is the last one.
  const at::Tensor starts = at::cat({at::ones_like(docs.narrow(1, 0, 1), at::kBool),
                                     docs.narrow(1, 1, seq - 1) != docs.narrow(1, 0, seq - 1)},
                                    1);
  const at::Tensor start_of = std::get<0>(at::cummax(at::where(starts, index, at::zeros_like(index)), 1));
  if (!with_mask) return {index - start_of, at::Tensor()};
  const at::Tensor causal = at::ones({seq, seq}, docs.options().dtype(at::kBool)).tril();
  const at::Tensor same = docs.unsqueeze(2) == docs.unsqueeze(1);
  return {index - start_of, same.logical_and(causal).unsqueeze(1)};
}

}  // namespace tessera::documents
