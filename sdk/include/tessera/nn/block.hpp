// One pre-norm transformer block: x + attention(attention_norm(x)), then x + mlp(mlp_norm(x));
// a "sandwich" block (Gemma 2 and 3) also normalises each branch's output before adding it:
// x + attention_post_norm(attention(attention_norm(x))), the same around the MLP.
// A family says which parts and under which names (its checkpoints' and Hugging Face's): GPT-2's
// ln_1 / attn / ln_2 / mlp, Llama's input_layernorm / self_attn / post_attention_layernorm / mlp,
// Gemma's input_layernorm / self_attn / post_attention_layernorm / pre_feedforward_layernorm / mlp /
// post_feedforward_layernorm.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "tessera/export.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/layer.hpp"

namespace tessera::nn {

template <class Part>
struct Named {
  std::string name;
  std::shared_ptr<Part> part;
};

struct BlockParts {
  Named<Norm> attention_norm;
  Named<AttentionLayer> attention;
  Named<Norm> mlp_norm;
  Named<FeedForward> mlp;  // dense, or a MoeLayer
  // The sandwich's output norms; a null part: none.
  Named<Norm> attention_post_norm;
  Named<Norm> mlp_post_norm;
};

class TESSERA_API TransformerBlock : public torch::nn::Module {
 public:
  // Registers the parts in the order given (the order of the block's parameters).
  explicit TransformerBlock(const BlockParts& parts);

  at::Tensor forward(const at::Tensor& x, const AttentionInputs& inputs) {
    return feed_forward(attend(x, inputs), inputs);
  }
  at::Tensor attend(const at::Tensor& x, const AttentionInputs& inputs);
  // In a generation pass (inputs.cache set), the feed-forward layer's forward_cached.
  at::Tensor feed_forward(const at::Tensor& x, const AttentionInputs& inputs = {});

  // The block's mixture of experts; null in a dense block.
  MoeLayer* experts() const { return experts_; }

  // forward() with activation checkpointing: a dense block is recomputed whole in backward; a
  // mixture-of-experts block its attention only (the router's losses need their graph from the
  // forward pass, its statistics are counted once, and the experts' all-to-alls stay out of
  // backward's recomputation).
  static at::Tensor checkpointed(const std::shared_ptr<TransformerBlock>& block, const at::Tensor& x,
                                 const AttentionInputs& inputs);

 private:
  std::shared_ptr<Norm> attention_norm_, mlp_norm_;
  std::shared_ptr<Norm> attention_post_norm_, mlp_post_norm_;  // null outside a sandwich
  std::shared_ptr<AttentionLayer> attention_;
  std::shared_ptr<FeedForward> mlp_;
  MoeLayer* experts_ = nullptr;
};

}  // namespace tessera::nn
