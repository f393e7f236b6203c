// RMS normalisation over the last dimension times a weight, with the kernel chosen here:
// y = x / sqrt(mean(x²) + eps) · (weight + offset), as Llama's RMSNorm (offset 0) and Gemma's
// (offset 1, its weight stored as a difference from one) compute it. On a CPU with AVX2, float32
// x and weight run on Tessera's kernel, forward and backward (a row read twice each way, where
// LibTorch differentiates its composite form in about ten passes); everywhere else (GPUs, bf16 x)
// it is LibTorch's rms_norm in float32 times the weight, the product in x's dtype for offset 0 and
// in float32 for offset 1. Both agree within float rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include "tessera/export.hpp"

namespace tessera {

// x: [..., dim]; weight: [dim]. Returns x's shape and dtype. Differentiable in x and weight.
TESSERA_API at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double offset = 0.0);

// Whether rms_norm(x, weight, ...) runs on Tessera's CPU kernel: CPU float32 x and weight, weight
// of x's last size, and a CPU with AVX2 and FMA.
TESSERA_API bool rms_norm_uses_cpu_kernel(const at::Tensor& x, const at::Tensor& weight);

}  // namespace tessera
