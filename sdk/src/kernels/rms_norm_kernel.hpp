// The CPU kernel behind tessera::rms_norm (rms_norm.cpp): RMS normalisation of rows of float32
// times a weight, forward and backward, in AVX2 + FMA (callers check avx2::cpu_supported() first).
// Plain pointers, no LibTorch: the caller splits the rows over its threads.
//
// y = x̂ · (w + offset), x̂ = x · r, r = 1 / sqrt(mean(x²) + eps) over a row's `cols` elements.
// Backward, with g = dy · (w + offset): dx = r · (g − x̂ · mean(g · x̂)), dw = Σ_rows dy · x̂.
#pragma once

#include <cstdint>

namespace tessera::rms_norm_kernel {

// Rows [0, rows) of x into y; r[row] receives each row's reciprocal RMS.
void forward(std::int64_t rows, std::int64_t cols, float eps, float offset, const float* x, const float* w, float* y,
             float* r);

// dx for rows [0, rows) from x, r (forward's) and dy; dw[c] += Σ_row dy · x̂ (added in row order).
void backward(std::int64_t rows, std::int64_t cols, float offset, const float* x, const float* w, const float* r,
              const float* dy, float* dx, float* dw);

}  // namespace tessera::rms_norm_kernel
