// The three kinds of layer a transformer block is made of, as small interfaces, so that one block
// (tessera/nn/block.hpp) composes any family's: a norm, an attention layer, a feed-forward layer
// (dense or a mixture of experts). A family with a new kind of attention (multi-head latent
// attention, say) implements AttentionLayer and reuses everything else.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {
class KvCache;
}

namespace tessera::nn {

// One rotary embedding's tables for a forward pass (RotaryEmbedding::tables).
struct RotaryTables {
  at::Tensor cos, sin;
};

// What packed documents and rotary positions give every attention layer of a forward pass.
struct AttentionInputs {
  at::Tensor mask;       // optional [batch, 1, seq, seq] bool: which keys each query may see
  at::Tensor documents;  // under context parallelism, instead of the mask: [batch, whole seq] ids
  // The model's rotary tables for this pass, one per rotary embedding it has (Gemma 3: the
  // sliding layers' and the global layers'); an attention layer reads the one its spec names.
  // Empty: none.
  std::vector<RotaryTables> rotary;
  // Generation (Model::decode): the cache this pass reads and extends, and the attention layer's
  // entry in it (its block's index); the mask and documents are then unset, the rotary tables at
  // the pass' positions. Null in training.
  KvCache* cache = nullptr;
  std::size_t cache_layer = 0;

  const RotaryTables* rotary_at(std::size_t index) const { return index < rotary.size() ? &rotary[index] : nullptr; }
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
  // A generation pass (Model::decode) over `cache`, the block's entry `layer`: the same output as
  // forward(x); a layer may keep what it makes from its weights in the cache for the cache's life
  // (KvCache::derived). By default, forward(x).
  virtual at::Tensor forward_cached(const at::Tensor& x, KvCache& cache, std::size_t layer);
};

}  // namespace tessera::nn
