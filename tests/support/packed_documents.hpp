// What a model that masks_documents() must do, checked the same way for every such model: a row
// packing two documents, with document_ids, gives each document's logits (and hidden states)
// exactly as the document alone does, and without document_ids the second sees the first.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tessera/components/model.hpp"

namespace tessera::testing {

inline void expect_packed_documents_computed_alone(Model& model) {
  model.eval();
  EXPECT_TRUE(model.masks_documents());
  const at::Tensor a = at::tensor({3, 1, 4}, at::kLong).view({1, 3});
  const at::Tensor b = at::tensor({1, 5, 9, 2, 6}, at::kLong).view({1, 5});
  const at::Tensor packed = at::cat({a, b}, 1);
  const at::Tensor documents = at::tensor({7, 7, 7, 8, 8, 8, 8, 8}, at::kLong).view({1, 8});
  const at::Tensor logits = model.forward(packed, documents);
  EXPECT_TRUE(at::allclose(logits.narrow(1, 0, 3), model.forward(a), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(logits.narrow(1, 3, 5), model.forward(b), 1e-5, 1e-5));
  EXPECT_FALSE(at::allclose(model.forward(packed).narrow(1, 3, 5), model.forward(b), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(model.forward_hidden(packed, documents).narrow(1, 3, 5), model.forward_hidden(b), 1e-5, 1e-5));
}

}  // namespace tessera::testing
