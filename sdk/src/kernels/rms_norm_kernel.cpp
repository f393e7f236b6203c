// The RMS normalisation kernel (rms_norm_kernel.hpp), in AVX2 + FMA intrinsics.
//
// Why it exists: LibTorch's CPU rms_norm has a fused forward but differentiates through its
// composite form, about ten passes over the activations (pow, mean, rsqrt, products, sums) for
// each norm's backward: a Llama block's two norms over 16 × 73 × 256 floats took about 1 ms each
// forward and backward on 2 cores, more than its matrix products' share allows. Here a row is read
// twice forward (its sum of squares, then the output) and twice backward.
// As in causal_attention_kernel.cpp, only static or file-local functions carry the AVX2 target.
#include "rms_norm_kernel.hpp"

#include <cmath>
#include <cstdlib>

#include "avx2_math.hpp"

#if defined(__x86_64__) || defined(__i386__)

namespace tessera::rms_norm_kernel {
namespace {

using avx2::horizontal_sum;
using avx2::kLanes;
using avx2::load_first;
using avx2::store_first;

// Σ a·b over n floats.
TESSERA_AVX2 float dot(std::int64_t n, const float* a, const float* b) {
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t c = 0; c < n; c += kLanes) {
    acc = _mm256_fmadd_ps(load_first(a + c, n - c), load_first(b + c, n - c), acc);
  }
  return horizontal_sum(acc);
}

TESSERA_AVX2 void forward_rows(std::int64_t rows, std::int64_t cols, float eps, float offset, const float* x,
                               const float* w, float* y, float* r) {
  const __m256 shift = _mm256_set1_ps(offset);
  for (std::int64_t row = 0; row < rows; ++row) {
    const float* x_row = x + row * cols;
    float* y_row = y + row * cols;
    const float reciprocal = 1.0f / std::sqrt(dot(cols, x_row, x_row) / static_cast<float>(cols) + eps);
    r[row] = reciprocal;
    const __m256 scale = _mm256_set1_ps(reciprocal);
    for (std::int64_t c = 0; c < cols; c += kLanes) {
      const std::int64_t n = cols - c;
      const __m256 normed = _mm256_mul_ps(load_first(x_row + c, n), scale);
      store_first(y_row + c, _mm256_mul_ps(normed, _mm256_add_ps(load_first(w + c, n), shift)), n);
    }
  }
}

TESSERA_AVX2 void backward_rows(std::int64_t rows, std::int64_t cols, float offset, const float* x, const float* w,
                                const float* r, const float* dy, float* dx, float* dw) {
  const __m256 shift = _mm256_set1_ps(offset);
  for (std::int64_t row = 0; row < rows; ++row) {
    const float* x_row = x + row * cols;
    const float* dy_row = dy + row * cols;
    float* dx_row = dx + row * cols;
    const __m256 scale = _mm256_set1_ps(r[row]);
    // mean(g · x̂), and dw's terms on the way.
    __m256 acc = _mm256_setzero_ps();
    for (std::int64_t c = 0; c < cols; c += kLanes) {
      const std::int64_t n = cols - c;
      const __m256 normed = _mm256_mul_ps(load_first(x_row + c, n), scale);
      const __m256 grad = load_first(dy_row + c, n);
      store_first(dw + c, _mm256_fmadd_ps(grad, normed, load_first(dw + c, n)), n);
      acc = _mm256_fmadd_ps(_mm256_mul_ps(grad, _mm256_add_ps(load_first(w + c, n), shift)), normed, acc);
    }
    const __m256 mean = _mm256_set1_ps(horizontal_sum(acc) / static_cast<float>(cols));
    for (std::int64_t c = 0; c < cols; c += kLanes) {
      const std::int64_t n = cols - c;
      const __m256 normed = _mm256_mul_ps(load_first(x_row + c, n), scale);
      const __m256 g = _mm256_mul_ps(load_first(dy_row + c, n), _mm256_add_ps(load_first(w + c, n), shift));
      store_first(dx_row + c, _mm256_mul_ps(scale, _mm256_fnmadd_ps(normed, mean, g)), n);
    }
  }
}

}  // namespace

void forward(std::int64_t rows, std::int64_t cols, float eps, float offset, const float* x, const float* w, float* y,
             float* r) {
  forward_rows(rows, cols, eps, offset, x, w, y, r);
}

void backward(std::int64_t rows, std::int64_t cols, float offset, const float* x, const float* w, const float* r,
              const float* dy, float* dx, float* dw) {
  backward_rows(rows, cols, offset, x, w, r, dy, dx, dw);
}

}  // namespace tessera::rms_norm_kernel

#else  // not x86: avx2::cpu_supported() is false and rms_norm uses LibTorch's operators.

namespace tessera::rms_norm_kernel {

void forward(std::int64_t, std::int64_t, float, float, const float*, const float*, float*, float*) { std::abort(); }
void backward(std::int64_t, std::int64_t, float, const float*, const float*, const float*, const float*, float*,
              float*) {
  std::abort();
}

}  // namespace tessera::rms_norm_kernel

#endif
