// Activation checkpointing for models: run a block without keeping its intermediate activations
// and run it again in backward. LibTorch has no torch.utils.checkpoint; this is its reentrant
// form on the C++ autograd API. The recomputation restores the random state the forward pass
// saw (dropout draws the same masks) and its autocast state, so gradients equal those of the
// plain block exactly; the generator is left as it was before the recomputation.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "tessera/export.hpp"

namespace tessera {

using BlockBody = std::function<at::Tensor(const at::Tensor&)>;

// body(input), keeping only `input` for backward. `body` is kept until backward: it must own
// what it captures (capture modules by shared_ptr, indices by value). Without grad mode it is
// body(input) and nothing more.
TESSERA_API at::Tensor checkpoint_activations(const BlockBody& body, const at::Tensor& input);

// Which of a model's blocks a config's activation checkpointing covers: every `every`-th block
// (0, every, 2·every, ...) when enabled.
inline bool checkpoints_block(bool enabled, std::int64_t every, std::int64_t block) {
  return enabled && every > 0 && block % every == 0;
}

}  // namespace tessera
