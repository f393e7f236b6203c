// The fused bias + GELU kernel (gelu_kernel.hpp), in AVX2 + FMA intrinsics.
//
// Why it exists: LibTorch's CPU GELU evaluates erf with a general-purpose routine twice (forward,
// and again in backward), and a linear layer's bias is added by copying it into every row of the
// output before the matrix product. Here one pass adds the bias and applies GELU, and one pass
// makes the gradient and sums the bias gradient; both share one exp between erf and the density.
// As in causal_attention_kernel.cpp, only static or file-local functions carry the AVX2 target.
#include "gelu_kernel.hpp"

#include <cstdlib>

#include "avx2_math.hpp"

#if defined(__x86_64__) || defined(__i386__)

namespace tessera::gelu_kernel {
namespace {

using avx2::kLanes;

TESSERA_AVX2 inline __m256 load(const float* p, std::int64_t n) { return avx2::load_first(p, n); }
TESSERA_AVX2 inline void store(float* p, __m256 v, std::int64_t n) { avx2::store_first(p, v, n); }

// Φ(x) and φ(x) of 8 values at once.
struct NormalCdfPdf {
  __m256 cdf, pdf;
};

TESSERA_AVX2 inline NormalCdfPdf normal_cdf_pdf(__m256 x) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(sign_bit, x), _mm256_set1_ps(0.70710678118654752f));  // |x|/√2
  const __m256 e = avx2::exp(_mm256_mul_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(-0.5f)));            // e^{−z²}
  const __m256 t =
      _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), z, _mm256_set1_ps(1.0f)));
  __m256 poly = _mm256_set1_ps(1.061405429f);
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-1.453152027f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(1.421413741f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-0.284496736f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(0.254829592f));
  poly = _mm256_mul_ps(poly, t);
  // ½·erfc(|x|/√2) is Φ(−|x|): Φ(x) for x < 0, 1 − Φ(x) for x ≥ 0.
  const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(poly, e), _mm256_set1_ps(0.5f));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 cdf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc, negative);
  // A NaN input makes e NaN, and with it Φ and φ.
  return {cdf, _mm256_mul_ps(e, _mm256_set1_ps(0.39894228040143268f))};
}

TESSERA_AVX2 void forward_rows(std::int64_t rows, std::int64_t cols, float* h, const float* bias, float* y) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* h_row = h + r * cols;
    float* y_row = y + r * cols;
    for (std::int64_t c = 0; c < cols; c += kLanes) {
      const std::int64_t n = cols - c;
      __m256 x = load(h_row + c, n);
      if (bias != nullptr) {
        x = _mm256_add_ps(x, load(bias + c, n));
        store(h_row + c, x, n);
      }
      store(y_row + c, _mm256_mul_ps(x, normal_cdf_pdf(x).cdf), n);
    }
  }
}

TESSERA_AVX2 void backward_rows(std::int64_t rows, std::int64_t cols, const float* h, const float* dy, float* dh,
                                float* bias_grad) {
  if (bias_grad != nullptr) {
    for (std::int64_t c = 0; c < cols; c += kLanes) store(bias_grad + c, _mm256_setzero_ps(), cols - c);
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* h_row = h + r * cols;
    const float* dy_row = dy + r * cols;
    float* dh_row = dh + r * cols;
    for (std::int64_t c = 0; c < cols; c += kLanes) {
      const std::int64_t n = cols - c;
      const __m256 x = load(h_row + c, n);
      const NormalCdfPdf f = normal_cdf_pdf(x);
      const __m256 g = _mm256_mul_ps(load(dy_row + c, n), _mm256_fmadd_ps(x, f.pdf, f.cdf));
      store(dh_row + c, g, n);
      if (bias_grad != nullptr) store(bias_grad + c, _mm256_add_ps(load(bias_grad + c, n), g), n);
    }
  }
}

}  // namespace

void bias_gelu_forward(std::int64_t rows, std::int64_t cols, float* h, const float* bias, float* y) {
  forward_rows(rows, cols, h, bias, y);
}

void gelu_backward(std::int64_t rows, std::int64_t cols, const float* h, const float* dy, float* dh,
                   float* bias_grad) {
  backward_rows(rows, cols, h, dy, dh, bias_grad);
}

}  // namespace tessera::gelu_kernel

#else  // not x86: avx2::cpu_supported() is false and linear_gelu uses LibTorch's operators.

namespace tessera::gelu_kernel {

void bias_gelu_forward(std::int64_t, std::int64_t, float*, const float*, float*) { std::abort(); }
void gelu_backward(std::int64_t, std::int64_t, const float*, const float*, float*, float*) { std::abort(); }

}  // namespace tessera::gelu_kernel

#endif
