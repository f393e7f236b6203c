// Stacked expert weights for the mixture-of-experts layers of model/gpt_moe and model/llama
// (header-only, included by relative path): one linear layer per expert, stacked into one tensor
// per weight so a checkpoint, fsdp's units and expert parallelism's split (TensorShard::
// expert_stack) see one parameter, not E.
#pragma once

#include <cstdint>
#include <vector>

#include "gpt/transformer_parts.hpp"
#include "tessera/deferred_init.hpp"

namespace tessera::gpt_parts {

// weight [E, out, in], bias [E, out] (optional); E is this rank's experts under expert parallelism.
class ExpertLinear : public torch::nn::Module {
 public:
  ExpertLinear(std::int64_t experts, std::int64_t in, std::int64_t out, bool with_bias) {
    // On the meta device while the host defers initialisation (the model initialises them).
    weight = register_parameter("weight", tessera::new_parameter({experts, out, in}));
    if (with_bias) bias = register_parameter("bias", parameter({experts, out}, 0.0));
  }
  // Per-expert views; unbinding once per forward keeps backward to one stack per tensor.
  std::vector<at::Tensor> weights() const { return weight.unbind(0); }
  std::vector<at::Tensor> biases() const {
    return bias.defined() ? bias.unbind(0) : std::vector<at::Tensor>(static_cast<std::size_t>(weight.size(0)));
  }

  at::Tensor weight, bias;
};

}  // namespace tessera::gpt_parts
