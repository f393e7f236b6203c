// gelu(x·Wᵀ + b), the first half of a transformer's MLP, with the kernel chosen here. On a CPU
// with AVX2, for float32 outside autocast and the exact GELU, Tessera's own kernel adds the bias
// and applies GELU in one pass after a bias-free matrix product, and its backward makes the
// gradient and the bias gradient in one pass (tools/bench/vs_pytorch measures what it gains in a
// training step); everywhere else (GPUs, bf16 autocast, approximate "tanh") it is
// at::gelu(at::linear(x, weight, bias), approximate). Both agree within float rounding (the
// kernel's erf is within 1.5e-7 of the exact one).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "tessera/export.hpp"

namespace tessera {

// x: [..., in]; weight: [out, in]; bias: [out] or undefined; approximate: "none" or "tanh", as
// at::gelu. Returns [..., out].
TESSERA_API at::Tensor linear_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                   const std::string& approximate = "none");

// Whether linear_gelu(x, weight, bias, approximate) runs on Tessera's CPU kernel: CPU float32
// tensors, autocast off on the CPU, approximate "none", and a CPU with AVX2 and FMA.
TESSERA_API bool linear_gelu_uses_cpu_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                             const std::string& approximate = "none");

}  // namespace tessera
