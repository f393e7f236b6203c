#include "tessera/nn/block.hpp"

#include "tessera/nn/activation_checkpoint.hpp"

namespace tessera::nn {

TransformerBlock::TransformerBlock(const BlockParts& parts)
    : attention_norm_(register_module(parts.attention_norm.name, parts.attention_norm.part)),
      attention_(register_module(parts.attention.name, parts.attention.part)),
      mlp_norm_(register_module(parts.mlp_norm.name, parts.mlp_norm.part)),
      mlp_(register_module(parts.mlp.name, parts.mlp.part)),
      experts_(dynamic_cast<MoeLayer*>(parts.mlp.part.get())) {}

at::Tensor TransformerBlock::attend(const at::Tensor& x, const AttentionInputs& inputs) {
  return x + attention_->forward(attention_norm_->forward(x), inputs);
}

at::Tensor TransformerBlock::feed_forward(const at::Tensor& x) { return x + mlp_->forward(mlp_norm_->forward(x)); }

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
