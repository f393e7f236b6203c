#include "tessera/nn/norms.hpp"

#include <ATen/ops/layer_norm.h>

#include <string>
#include <utility>

#include "tessera/error.hpp"
#include "tessera/kernels/rms_norm.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::nn {

LayerNorm::LayerNorm(std::int64_t dim, bool bias, double eps, TensorParallel tp)
    : dim_(dim), eps_(eps), tp_(std::move(tp)) {
  weight_ = register_parameter("weight", parameter({dim}, 1.0));
  if (bias) bias_ = register_parameter("bias", parameter({dim}, 0.0));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  return at::layer_norm(x, {dim_}, tp_.replicated(weight_), bias_.defined() ? tp_.replicated(bias_) : bias_, eps_);
}

RmsNorm::RmsNorm(std::int64_t dim, double eps, TensorParallel tp, NormOver over, RmsWeight kind)
    : dim_(dim), eps_(eps), tp_(std::move(tp)), over_(over), kind_(kind) {
  weight = register_parameter("weight", parameter({dim}, kind == RmsWeight::one_plus ? 0.0 : 1.0));
}

at::Tensor RmsNorm::forward(const at::Tensor& x) const {
  const at::Tensor w = over_ == NormOver::heads ? tp_.shared_by_heads(weight) : tp_.replicated(weight);
  if (x.size(-1) != dim_) {
    throw Error("RmsNorm: an input of last size " + std::to_string(x.size(-1)) + " for a norm over " +
                std::to_string(dim_));
  }
  return tessera::rms_norm(x, w, eps_, kind_ == RmsWeight::one_plus ? 1.0 : 0.0);
}

}  // namespace tessera::nn
