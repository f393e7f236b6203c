// The CPU kernel of attention over a KvCache (cached_attention_kernel.hpp), in AVX2 + FMA
// intrinsics.
//
// Why it exists: a decode step asks for one query a row against a few dozen to a few thousand
// cached keys. LibTorch's CPU attention tiles that as a matrix product of one row per (batch, head)
// pair and spends most of a call setting tiles up (32 rows, 8 heads, 74 keys of 32: about 70 µs
// in float32 and 350-500 µs in bf16, for 2.4 MFLOP). Here a query row is a few vector dot
// products per key, one vectorised softmax and one weighted sum of the values, all in L1.
//
// As causal_attention_kernel.cpp: only this file's functions and avx2_math.hpp's carry the AVX2
// target, per function.
#include "cached_attention_kernel.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "avx2_math.hpp"

namespace tessera::attention_kernel {

std::size_t cached_scratch_floats(std::int64_t keys) { return static_cast<std::size_t>((keys + 7) / 8 * 8); }

}  // namespace tessera::attention_kernel

#if defined(__x86_64__) || defined(__i386__)

namespace tessera::attention_kernel {
namespace {

using avx2::exp;
using avx2::first_lanes;
using avx2::horizontal_sum;
using avx2::kLanes;

// scores[j] = scale · q·k_j for the keys row `visible` allows, -inf for the others; returns the
// largest score (-inf when none is seen, NaN when a score is NaN, so that it reaches the output).
TESSERA_AVX2 float scores_of(std::int64_t keys, std::int64_t dim, float scale, const float* q, Rows k,
                             const bool* visible, float* scores) {
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  float largest = minus_infinity;
  for (std::int64_t j = 0; j < keys; ++j) {
    if (visible != nullptr && !visible[j]) {
      scores[j] = minus_infinity;
      continue;
    }
    const float* key = k.data + j * k.stride;
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(key));
    for (std::int64_t d = kLanes; d < dim; d += kLanes) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(key + d), acc);
    }
    scores[j] = scale * horizontal_sum(acc);
    if (scores[j] > largest || std::isnan(scores[j])) largest = scores[j];  // once NaN, it stays
  }
  return largest;
}

// scores[j] = exp(scores[j] - largest), exactly 0 for the unseen (-inf) keys (a NaN stays); returns
// their sum.
TESSERA_AVX2 float exponentiate(std::int64_t keys, float largest, float* scores) {
  const __m256 shift = _mm256_set1_ps(largest), unseen = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 total = _mm256_setzero_ps();
  for (std::int64_t j = 0; j < keys; j += kLanes) {
    // The last vector's lanes past `keys` count as unseen (the scratch is whole vectors long).
    const __m256 lanes = first_lanes(keys - j);
    const __m256 s = _mm256_blendv_ps(unseen, _mm256_loadu_ps(scores + j), lanes);
    const __m256 seen = _mm256_cmp_ps(s, unseen, _CMP_NEQ_UQ);
    const __m256 e = _mm256_and_ps(exp(_mm256_sub_ps(s, shift)), seen);
    _mm256_storeu_ps(scores + j, e);
    total = _mm256_add_ps(total, e);
  }
  return horizontal_sum(total);
}

// out = Σ_j weights[j] · v_j / total, a vector of the head dimension at a time; an unseen key's
// value is never read (whatever its slot holds).
TESSERA_AVX2 void weighted_values(std::int64_t keys, std::int64_t dim, const float* weights, float total, Rows v,
                                  float* out) {
  const __m256 inverse = _mm256_set1_ps(1.0f / total);
  for (std::int64_t d = 0; d < dim; d += kLanes) {
    __m256 acc = _mm256_setzero_ps();
    for (std::int64_t j = 0; j < keys; ++j) {
      if (weights[j] == 0.0f) continue;
      acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[j]), _mm256_loadu_ps(v.data + j * v.stride + d), acc);
    }
    _mm256_storeu_ps(out + d, _mm256_mul_ps(acc, inverse));
  }
}

}  // namespace

TESSERA_AVX2 void cached_pair(std::int64_t queries, std::int64_t keys, std::int64_t dim, float scale, Rows q, Rows k,
                              Rows v, const bool* visible, std::int64_t visible_stride, MutableRows out,
                              float* scratch) {
  for (std::int64_t i = 0; i < queries; ++i) {
    const bool* row_visible = visible != nullptr ? visible + i * visible_stride : nullptr;
    float* row_out = out.data + i * out.stride;
    const float largest = scores_of(keys, dim, scale, q.data + i * q.stride, k, row_visible, scratch);
    if (largest == -std::numeric_limits<float>::infinity()) {
      for (std::int64_t d = 0; d < dim; ++d) row_out[d] = 0.0f;
      continue;
    }
    weighted_values(keys, dim, scratch, exponentiate(keys, largest, scratch), v, row_out);
  }
}

}  // namespace tessera::attention_kernel

#else  // not x86: avx2::cpu_supported() is false and callers use LibTorch's attention.

namespace tessera::attention_kernel {

void cached_pair(std::int64_t, std::int64_t, std::int64_t, float, Rows, Rows, Rows, const bool*, std::int64_t,
                 MutableRows, float*) {
  std::abort();
}

}  // namespace tessera::attention_kernel

#endif
