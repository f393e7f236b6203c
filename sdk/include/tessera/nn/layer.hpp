// The three kinds of layer a transformer block is made of, as small interfaces, so that one block
// (tessera/nn/block.hpp) composes any family's: a norm, an attention layer, a feed-forward layer
// (dense or a mixture of experts). A family with a new kind of attention (multi-head latent
// attention, say) implements AttentionLayer and reuses everything else.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "tessera/export.hpp"

namespace tessera::nn {

// What packed documents and rotary positions give every attention layer of a forward pass.
struct AttentionInputs {
  at::Tensor mask;       // optional [batch, 1, seq, seq] bool: which keys each query may see
  at::Tensor documents;  // under context parallelism, instead of the mask: [batch, whole seq] ids
  at::Tensor cos, sin;   // rotary tables for this pass (RotaryEmbedding::tables); undefined: none
};

class TESSERA_API Norm : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) const = 0;
};

class TESSERA_API AttentionLayer : public torch::nn::Module {
 public:
  // `x`: the normalised residual stream of this rank ([batch, seq, hidden]; its tensor- or
  // context-parallel slice). Returns the attention's output to add to the stream.
  virtual at::Tensor forward(const at::Tensor& x, const AttentionInputs& inputs) = 0;
};

class TESSERA_API FeedForward : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

}  // namespace tessera::nn
