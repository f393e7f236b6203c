// Vector math for the SDK's CPU kernels (causal_attention_kernel.cpp, gelu_kernel.cpp): exp,
// horizontal sums and maxima, lane masks, on 8 floats with AVX2 + FMA. Every function carries the
// AVX2 target itself and has internal linkage (static), so a copy compiled for AVX2 is never the
// one a caller on another CPU gets; only functions with the same target call them.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstdint>

#define TESSERA_AVX2 __attribute__((target("avx2,fma")))

namespace tessera::avx2 {

inline constexpr std::int64_t kLanes = 8;

// exp(x) to about one float ulp (Cephes' expf polynomial). NaN stays NaN; below -88.4 it is 0.
TESSERA_AVX2 static inline __m256 exp(__m256 x) {
  // The constant first: max/min return their second operand when either is NaN.
  x = _mm256_max_ps(_mm256_set1_ps(-88.3762626647949f), x);
  x = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), x);
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  // x - n·ln2, with ln2 split in two so the reduction stays exact.
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  // 2^n through the exponent bits (n = -127 gives +0: the result underflows to zero).
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

// All ones in lanes [0, n), zeros in the rest; n in [0, 8].
TESSERA_AVX2 static inline __m256 first_lanes(std::int64_t n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), index));
}

// The first min(n, 8) floats at p (n ≥ 1); the lanes past n are zero and nothing past them is read.
TESSERA_AVX2 static inline __m256 load_first(const float* p, std::int64_t n) {
  if (n >= kLanes) return _mm256_loadu_ps(p);
  return _mm256_maskload_ps(p, _mm256_castps_si256(first_lanes(n)));
}

// Stores the first min(n, 8) lanes of v at p (n ≥ 1); nothing past them is written.
TESSERA_AVX2 static inline void store_first(float* p, __m256 v, std::int64_t n) {
  if (n >= kLanes) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, _mm256_castps_si256(first_lanes(n)), v);
  }
}

TESSERA_AVX2 static inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

TESSERA_AVX2 static inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 0x55));
  return _mm_cvtss_f32(m);
}

}  // namespace tessera::avx2

#endif

namespace tessera::avx2 {

// Whether this CPU runs the SDK's AVX2 kernels (AVX2 and FMA).
bool cpu_supported();

}  // namespace tessera::avx2
