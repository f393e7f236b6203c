// The norms of a pre-norm transformer: LayerNorm (with or without bias) and RMSNorm. Under
// sequence parallelism each normalises this rank's slice of the sequence and its parameters'
// gradients are summed over the tensor-parallel ranks (TensorParallel::replicated).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>

#include "tessera/export.hpp"
#include "tessera/nn/layer.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera::nn {

// Parameters `weight` and, with `bias`, `bias` (torch::nn::LayerNorm has no bias switch).
class TESSERA_API LayerNorm : public Norm {
 public:
  LayerNorm(std::int64_t dim, bool bias, double eps = 1e-5, TensorParallel tp = {});
  at::Tensor forward(const at::Tensor& x) const override;

 private:
  std::int64_t dim_;
  double eps_;
  TensorParallel tp_;
  at::Tensor weight_, bias_;  // bias_ stays undefined when bias is off
};

// What a norm normalises, for how its weight's gradient is summed under tensor parallelism.
enum class NormOver {
  stream,  // the residual stream: sequence slices under sequence parallelism
  heads,   // each of this rank's attention heads (Qwen3's q_norm / k_norm over head_dim)
};

// How an RMSNorm's weight scales the normalised x.
enum class RmsWeight {
  scale,     // x̂ · weight, weight starting at one (Llama, Qwen, DeepSeek)
  one_plus,  // x̂ · (1 + weight), weight starting at zero (Gemma)
};

// x / rms(x) · weight, normalised in float32 whatever the compute dtype (as Hugging Face's
// LlamaRMSNorm, Qwen's and DeepSeek's do), then scaled in the input's dtype; with
// RmsWeight::one_plus scaled by (1 + weight) in float32 and then cast (Gemma's order).
class TESSERA_API RmsNorm : public Norm {
 public:
  RmsNorm(std::int64_t dim, double eps, TensorParallel tp = {}, NormOver over = NormOver::stream,
          RmsWeight kind = RmsWeight::scale);
  at::Tensor forward(const at::Tensor& x) const override;
  RmsWeight kind() const { return kind_; }

  at::Tensor weight;

 private:
  std::int64_t dim_;
  double eps_;
  TensorParallel tp_;
  NormOver over_;
  RmsWeight kind_;
};

}  // namespace tessera::nn
