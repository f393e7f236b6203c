// The CPU kernel behind tessera::linear_gelu (linear_gelu.cpp): the exact GELU with its bias add
// fused in, forward and backward, over rows of float32 in AVX2 + FMA (callers check
// avx2::cpu_supported() first). Plain pointers, no LibTorch.
//
// GELU(x) = x·Φ(x), Φ(x) = ½(1 + erf(x/√2)); GELU'(x) = Φ(x) + x·φ(x), φ(x) = exp(−x²/2)/√(2π).
// erf is the Abramowitz–Stegun 7.1.26 form (absolute error below 1.5e-7, oneDNN's GELU uses
// it too), computed as erfc for |x| so that Φ keeps its relative precision in the lower tail.
#pragma once

#include <cstdint>

namespace tessera::gelu_kernel {

// For rows [0, rows) of `cols` floats: h += bias (when not null), then y = GELU(h). h keeps the
// pre-activation for backward.
void bias_gelu_forward(std::int64_t rows, std::int64_t cols, float* h, const float* bias, float* y);

// dh = dy · GELU'(h) for rows [0, rows); when `bias_grad` is not null, bias_grad[c] = Σ_r dh[r][c]
// (overwritten, summed in row order).
void gelu_backward(std::int64_t rows, std::int64_t cols, const float* h, const float* dy, float* dh,
                   float* bias_grad);

}  // namespace tessera::gelu_kernel
