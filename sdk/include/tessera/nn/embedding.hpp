// A lookup table (token or learned position embedding): torch::nn::Embedding without allocating
// at construction, so a deferred model holds it on the meta device. A vocabulary-parallel token
// embedding is this table at this rank's rows, looked up through TensorParallel::vocab_embedding.
#pragma once

#include <ATen/ops/embedding.h>
#include <torch/nn/module.h>

#include <cstdint>

#include "tessera/nn/deferred_init.hpp"

namespace tessera::nn {

class Embedding : public torch::nn::Module {
 public:
  Embedding(std::int64_t count, std::int64_t dim) { weight = register_parameter("weight", new_parameter({count, dim})); }
  at::Tensor forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

  at::Tensor weight;
};

}  // namespace tessera::nn
