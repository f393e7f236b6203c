#include "tessera/nn/block.hpp"

#include "tessera/nn/activation_checkpoint.hpp"

namespace tessera::nn {

at::Tensor FeedForward::forward_cached(const at::Tensor& x, KvCache&, std::size_t) { return forward(x); }

TransformerBlock::TransformerBlock(const BlockParts& parts)
    : attention_norm_(register_module(parts.attention_norm.name, parts.attention_norm.part)),
      attention_(register_module(parts.attention.name, parts.attention.part)),
      mlp_norm_(register_module(parts.mlp_norm.name, parts.mlp_norm.part)),
      mlp_(register_module(parts.mlp.name, parts.mlp.part)),
      experts_(dynamic_cast<MoeLayer*>(parts.mlp.part.get())) {
  if (parts.attention_post_norm.part) {
    attention_post_norm_ = register_module(parts.attention_post_norm.name, parts.attention_post_norm.part);
  }
  if (parts.mlp_post_norm.part) mlp_post_norm_ = register_module(parts.mlp_post_norm.name, parts.mlp_post_norm.part);
}

at::Tensor TransformerBlock::attend(const at::Tensor& x, const AttentionInputs& inputs) {
  const at::Tensor branch = attention_->forward(attention_norm_->forward(x), inputs);
  return x + (attention_post_norm_ ? attention_post_norm_->forward(branch) : branch);
}

at::Tensor TransformerBlock::feed_forward(const at::Tensor& x, const AttentionInputs& inputs) {
  const at::Tensor normed = mlp_norm_->forward(x);
  const at::Tensor branch =
      inputs.cache ? mlp_->forward_cached(normed, *inputs.cache, inputs.cache_layer) : mlp_->forward(normed);
  return x + (mlp_post_norm_ ? mlp_post_norm_->forward(branch) : branch);
}

at::Tensor TransformerBlock::checkpointed(const std::shared_ptr<TransformerBlock>& block, const at::Tensor& x,
                                          const AttentionInputs& inputs) {
  // The bodies outlive this call (backward runs them again): they own the block and the inputs.
  if (block->experts()) {
    const BlockBody attention = [block, inputs](const at::Tensor& h) { return block->attend(h, inputs); };
    return block->feed_forward(checkpoint_activations(attention, x));
  }
  const BlockBody body = [block, inputs](const at::Tensor& h) { return block->forward(h, inputs); };
  return checkpoint_activations(body, x);
}

}  // namespace tessera::nn
