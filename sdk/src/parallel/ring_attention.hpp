// Ring attention for context parallelism (tessera/parallel/context_parallel.hpp, cp_type ring),
// internal to the SDK: ContextParallel::attend is the public entry.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "tessera/run/communicator.hpp"

namespace tessera {

// q [B, H, T/cp, D], k and v [B, Hkv, T/cp, D]: this rank's slice in ContextParallel's balanced
// layout (chunks r and 2 cp - 1 - r of 2 cp); document_ids [B, T] of the whole sequence or
// undefined. Causal attention of the slice's queries over every key, differentiable.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& document_ids,
                          const std::shared_ptr<Communicator>& group);

}  // namespace tessera
