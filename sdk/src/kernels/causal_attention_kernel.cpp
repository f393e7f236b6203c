// The CPU causal-attention kernel (causal_attention_kernel.hpp), in AVX2 + FMA intrinsics.
//
// Why it exists: LibTorch's CPU attention (its flash kernel) runs short sequences as many tiny
// matrix products with a softmax between them, and spends about three times the time its
// arithmetic needs at the quickstart's shape (tools/bench/attention). Here each (batch, head)
// pair is one task that keeps its rows in cache: three register-tiled products that stop at the
// diagonal (the masked upper triangle is never computed), a vectorised softmax, and the saved
// probabilities for backward instead of a recomputation.
//
// Only this file's functions and avx2_math.hpp's (static: each file's own copy) carry the AVX2
// target, as a per-function attribute rather than a flag for the file: no inline function from a
// header is compiled for AVX2 here, so no AVX2 code can reach a caller through a copy the linker
// shares with other files. Callers check avx2::cpu_supported() first.
#include "causal_attention_kernel.hpp"

#include <cstdlib>
#include <cstring>

#include "avx2_math.hpp"

#if defined(__x86_64__) || defined(__i386__)

namespace tessera::attention_kernel {
namespace {

using avx2::exp;
using avx2::first_lanes;
using avx2::horizontal_max;
using avx2::horizontal_sum;
using avx2::kLanes;

inline std::int64_t smaller(std::int64_t a, std::int64_t b) { return a < b ? a : b; }

// to[d · ld + j] = from[j][d] for j < seq, zero for j in [seq, ld): a matrix's columns as rows,
// so the dot products below read them as vectors. Blocks of 8 × 8 are transposed in registers.
TESSERA_AVX2 void transpose_into(std::int64_t seq, std::int64_t dim, Rows from, float* to, std::int64_t ld) {
  const std::int64_t whole = seq / kLanes * kLanes;
  for (std::int64_t j0 = 0; j0 < whole; j0 += kLanes) {
    for (std::int64_t d0 = 0; d0 < dim; d0 += kLanes) {
      __m256 r[8], t[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(from.data + (j0 + i) * from.stride + d0);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      // r[c] holds column c of rows 0-3 in its low half and column c + 4 in its high half, r[c + 4]
      // the same of rows 4-7: the halves put together are the columns.
      for (int c = 0; c < 4; ++c) {
        _mm256_storeu_ps(to + (d0 + c) * ld + j0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20));
        _mm256_storeu_ps(to + (d0 + c + 4) * ld + j0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31));
      }
    }
  }
  for (std::int64_t d = 0; d < dim; ++d) {
    float* row = to + d * ld;
    for (std::int64_t j = whole; j < seq; ++j) row[j] = from.data[j * from.stride + d];
    for (std::int64_t j = seq; j < ld; ++j) row[j] = 0.0f;
  }
}

// The rows of `from` copied next to each other into `to`: the products read a matrix's rows many
// times, and rows a large stride apart (a pair's rows of a [batch, seq, heads, dim] tensor) fall
// into few cache sets and evict each other.
Rows pack(std::int64_t seq, std::int64_t dim, Rows from, float* to) {
  for (std::int64_t i = 0; i < seq; ++i) {
    const float* row = from.data + i * from.stride;
    std::memcpy(to + i * dim, row, static_cast<std::size_t>(dim) * sizeof(float));
  }
  return {to, dim};
}

// out[i][j] = alpha · a_i·b_j for the columns j of the vectors that reach row i's diagonal, with b
// given transposed (bt, rows of ld floats). A tile is 4 rows × VECTORS vectors of columns: 4·V
// accumulators, one broadcast of a's element and V loads of bt per step along the head dimension.
template <int VECTORS>
TESSERA_AVX2 inline void row_dots_tile(std::int64_t dim, float alpha, const float* const a_rows[4], std::int64_t rows,
                                       const float* bt, std::int64_t ld, std::int64_t column, float* out,
                                       std::int64_t first_row) {
  __m256 acc[4][VECTORS];
  for (int r = 0; r < 4; ++r) {
    for (int v = 0; v < VECTORS; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (std::int64_t d = 0; d < dim; ++d) {
    __m256 b[VECTORS];
    for (int v = 0; v < VECTORS; ++v) b[v] = _mm256_loadu_ps(bt + d * ld + column + v * kLanes);
    for (int r = 0; r < 4; ++r) {
      const __m256 x = _mm256_broadcast_ss(a_rows[r] + d);
      for (int v = 0; v < VECTORS; ++v) acc[r][v] = _mm256_fmadd_ps(x, b[v], acc[r][v]);
    }
  }
  const __m256 scale = _mm256_set1_ps(alpha);
  // Constant bounds throughout, so the accumulators stay in registers.
  for (int r = 0; r < 4; ++r) {
    if (r >= rows) break;
    for (int v = 0; v < VECTORS; ++v) {
      _mm256_storeu_ps(out + (first_row + r) * ld + column + v * kLanes, _mm256_mul_ps(scale, acc[r][v]));
    }
  }
}

TESSERA_AVX2 void lower_row_dots(std::int64_t seq, std::int64_t dim, float alpha, Rows a, const float* bt,
                                 std::int64_t ld, float* out) {
  for (std::int64_t i0 = 0; i0 < seq; i0 += 4) {
    const std::int64_t rows = smaller(4, seq - i0);
    // A short last tile repeats its last row and stores only the real ones.
    const float* a_rows[4];
    for (std::int64_t r = 0; r < 4; ++r) a_rows[r] = a.data + (i0 + smaller(r, rows - 1)) * a.stride;
    const std::int64_t vectors = (i0 + rows + kLanes - 1) / kLanes;  // columns [0, last row's diagonal]
    std::int64_t v = 0;
    for (; v + 2 <= vectors; v += 2) row_dots_tile<2>(dim, alpha, a_rows, rows, bt, ld, v * kLanes, out, i0);
    if (v < vectors) row_dots_tile<1>(dim, alpha, a_rows, rows, bt, ld, v * kLanes, out, i0);
  }
}

// acc0 += w0 · x and acc1 += w1 · x for one row x of VECTORS vectors: the step of both
// triangular products below, two output rows at a time sharing each load of x.
template <int VECTORS>
TESSERA_AVX2 inline void update_two_rows(const float* w0, const float* w1, const float* x, __m256 (&acc0)[VECTORS],
                                         __m256 (&acc1)[VECTORS]) {
  const __m256 a = _mm256_broadcast_ss(w0), b = _mm256_broadcast_ss(w1);
  for (int v = 0; v < VECTORS; ++v) {
    const __m256 xv = _mm256_loadu_ps(x + v * kLanes);
    acc0[v] = _mm256_fmadd_ps(a, xv, acc0[v]);
    acc1[v] = _mm256_fmadd_ps(b, xv, acc1[v]);
  }
}

// out_i = Σ_{j ≤ i} l[i][j] · x_j: the lower-triangular l (rows of ld floats) times the rows of x.
// A tile is 2 rows × VECTORS vectors of the head dimension; nothing right of a diagonal is read.
template <int VECTORS>
TESSERA_AVX2 inline void lower_times_rows_tile(const float* l0, const float* l1, std::int64_t i0, Rows x,
                                               std::int64_t column, float* out0, float* out1) {
  __m256 acc0[VECTORS], acc1[VECTORS];
  for (int v = 0; v < VECTORS; ++v) acc0[v] = acc1[v] = _mm256_setzero_ps();
  for (std::int64_t j = 0; j <= i0; ++j) update_two_rows(l0 + j, l1 + j, x.data + j * x.stride + column, acc0, acc1);
  for (int v = 0; v < VECTORS; ++v) _mm256_storeu_ps(out0 + column + v * kLanes, acc0[v]);
  if (out1 == nullptr) return;
  // Row i0 + 1's diagonal, alone: row i0 never meets x_{i0+1} (0 · Inf would be NaN).
  const __m256 w1 = _mm256_broadcast_ss(l1 + i0 + 1);
  const float* x_next = x.data + (i0 + 1) * x.stride + column;
  for (int v = 0; v < VECTORS; ++v) {
    acc1[v] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x_next + v * kLanes), acc1[v]);
    _mm256_storeu_ps(out1 + column + v * kLanes, acc1[v]);
  }
}

TESSERA_AVX2 void lower_times_rows(std::int64_t seq, std::int64_t dim, const float* l, std::int64_t ld, Rows x,
                                   MutableRows out) {
  for (std::int64_t i0 = 0; i0 < seq; i0 += 2) {
    const bool pair = i0 + 1 < seq;
    const float* l0 = l + i0 * ld;
    const float* l1 = pair ? l0 + ld : l0;
    float* out0 = out.data + i0 * out.stride;
    float* out1 = pair ? out0 + out.stride : nullptr;
    // The head dimension in chunks of four vectors (32 floats), then what is left.
    std::int64_t c = 0;
    for (; c + 4 * kLanes <= dim; c += 4 * kLanes) lower_times_rows_tile<4>(l0, l1, i0, x, c, out0, out1);
    switch ((dim - c) / kLanes) {
      case 3: lower_times_rows_tile<3>(l0, l1, i0, x, c, out0, out1); break;
      case 2: lower_times_rows_tile<2>(l0, l1, i0, x, c, out0, out1); break;
      case 1: lower_times_rows_tile<1>(l0, l1, i0, x, c, out0, out1); break;
      default: break;
    }
  }
}

// out_j = Σ_{i ≥ j} l[i][j] · x_i: the transpose of the lower-triangular l times the rows of x.
// A tile is 2 output rows (columns j0, j0 + 1 of l) × VECTORS vectors of the head dimension.
template <int VECTORS>
TESSERA_AVX2 inline void lower_transposed_times_rows_tile(std::int64_t seq, const float* l, std::int64_t ld,
                                                          std::int64_t j0, std::int64_t j1, Rows x,
                                                          std::int64_t column, float* out0, float* out1) {
  __m256 acc0[VECTORS], acc1[VECTORS];
  for (int v = 0; v < VECTORS; ++v) acc0[v] = acc1[v] = _mm256_setzero_ps();
  // Row j0 is column j0's alone: column j0 + 1 starts below it (0 · Inf would be NaN).
  const __m256 w_first = _mm256_broadcast_ss(l + j0 * ld + j0);
  const float* x_first = x.data + j0 * x.stride + column;
  for (int v = 0; v < VECTORS; ++v) acc0[v] = _mm256_mul_ps(w_first, _mm256_loadu_ps(x_first + v * kLanes));
  for (std::int64_t i = j0 + 1; i < seq; ++i) {
    update_two_rows(l + i * ld + j0, l + i * ld + j1, x.data + i * x.stride + column, acc0, acc1);
  }
  for (int v = 0; v < VECTORS; ++v) _mm256_storeu_ps(out0 + column + v * kLanes, acc0[v]);
  if (out1 != nullptr) {
    for (int v = 0; v < VECTORS; ++v) _mm256_storeu_ps(out1 + column + v * kLanes, acc1[v]);
  }
}

TESSERA_AVX2 void lower_transposed_times_rows(std::int64_t seq, std::int64_t dim, const float* l, std::int64_t ld,
                                              Rows x, MutableRows out) {
  for (std::int64_t j0 = 0; j0 < seq; j0 += 2) {
    const bool pair = j0 + 1 < seq;
    // Without a second column the tile reads column j0 twice and keeps one result: j0 + 1 may be
    // past the end of the row.
    const std::int64_t j1 = pair ? j0 + 1 : j0;
    float* out0 = out.data + j0 * out.stride;
    float* out1 = pair ? out0 + out.stride : nullptr;
    std::int64_t c = 0;
    for (; c + 4 * kLanes <= dim; c += 4 * kLanes) {
      lower_transposed_times_rows_tile<4>(seq, l, ld, j0, j1, x, c, out0, out1);
    }
    switch ((dim - c) / kLanes) {
      case 3: lower_transposed_times_rows_tile<3>(seq, l, ld, j0, j1, x, c, out0, out1); break;
      case 2: lower_transposed_times_rows_tile<2>(seq, l, ld, j0, j1, x, c, out0, out1); break;
      case 1: lower_transposed_times_rows_tile<1>(seq, l, ld, j0, j1, x, c, out0, out1); break;
      default: break;
    }
  }
}

// Each row i of s (scores in [0, i], anything beyond) becomes softmax over [0, i], zeros after.
TESSERA_AVX2 void causal_softmax_rows(std::int64_t seq, float* s, std::int64_t ld) {
  const __m256 minus_infinity = _mm256_set1_ps(-__builtin_inff());
  for (std::int64_t i = 0; i < seq; ++i) {
    float* row = s + i * ld;
    const std::int64_t n = i + 1, full = n / kLanes, rest = n % kLanes;
    const __m256 tail_mask = first_lanes(rest);
    // Without a partial vector, row + full · 8 may be the end of the buffer: nothing is read there.
    __m256 tail = rest > 0 ? _mm256_blendv_ps(minus_infinity, _mm256_loadu_ps(row + full * kLanes), tail_mask)
                           : minus_infinity;
    __m256 maximum = tail;
    for (std::int64_t v = 0; v < full; ++v) maximum = _mm256_max_ps(maximum, _mm256_loadu_ps(row + v * kLanes));
    const __m256 shift = _mm256_set1_ps(horizontal_max(maximum));
    __m256 sum = _mm256_setzero_ps();
    for (std::int64_t v = 0; v < full; ++v) {
      const __m256 e = exp(_mm256_sub_ps(_mm256_loadu_ps(row + v * kLanes), shift));
      _mm256_storeu_ps(row + v * kLanes, e);
      sum = _mm256_add_ps(sum, e);
    }
    std::int64_t end = full;  // vectors written so far
    if (rest > 0) {
      tail = _mm256_and_ps(exp(_mm256_sub_ps(tail, shift)), tail_mask);
      _mm256_storeu_ps(row + full * kLanes, tail);
      sum = _mm256_add_ps(sum, tail);
      end = full + 1;
    }
    const __m256 inverse = _mm256_set1_ps(1.0f / horizontal_sum(sum));
    for (std::int64_t v = 0; v < end; ++v) {
      _mm256_storeu_ps(row + v * kLanes, _mm256_mul_ps(_mm256_loadu_ps(row + v * kLanes), inverse));
    }
    for (std::int64_t v = end; v * kLanes < ld; ++v) _mm256_storeu_ps(row + v * kLanes, _mm256_setzero_ps());
  }
}

// ds holds dP = dO·Vᵀ on entry (row i valid in [0, i]); on return dS = scale · P ∘ (dP − δ_i),
// δ_i = Σ_j P[i][j]·dP[i][j], zeros right of the diagonal.
TESSERA_AVX2 void causal_softmax_backward_rows(std::int64_t seq, float scale, const float* p, float* ds,
                                               std::int64_t ld) {
  for (std::int64_t i = 0; i < seq; ++i) {
    const float* p_row = p + i * ld;
    float* row = ds + i * ld;
    const std::int64_t n = i + 1, vectors = (n + kLanes - 1) / kLanes;
    // The vector holding the diagonal may hold scores past it that dP never had: masked out.
    const __m256 last_mask = first_lanes(n - (vectors - 1) * kLanes);
    __m256 dot = _mm256_setzero_ps();
    for (std::int64_t v = 0; v < vectors; ++v) {
      __m256 product = _mm256_mul_ps(_mm256_loadu_ps(p_row + v * kLanes), _mm256_loadu_ps(row + v * kLanes));
      if (v == vectors - 1) product = _mm256_and_ps(product, last_mask);
      dot = _mm256_add_ps(dot, product);
    }
    const __m256 delta = _mm256_set1_ps(horizontal_sum(dot)), factor = _mm256_set1_ps(scale);
    for (std::int64_t v = 0; v < vectors; ++v) {
      __m256 g = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(p_row + v * kLanes),
                                             _mm256_sub_ps(_mm256_loadu_ps(row + v * kLanes), delta)),
                               factor);
      if (v == vectors - 1) g = _mm256_and_ps(g, last_mask);
      _mm256_storeu_ps(row + v * kLanes, g);
    }
    for (std::int64_t v = vectors; v * kLanes < ld; ++v) _mm256_storeu_ps(row + v * kLanes, _mm256_setzero_ps());
  }
}

}  // namespace

std::size_t forward_scratch_floats(std::int64_t seq, std::int64_t dim) {
  return static_cast<std::size_t>(dim * row_len(seq) + seq * dim);
}

std::size_t backward_scratch_floats(std::int64_t seq, std::int64_t dim) {
  return static_cast<std::size_t>((dim + seq) * row_len(seq) + 3 * seq * dim);
}

void forward_pair(std::int64_t seq, std::int64_t dim, float scale, Rows q, Rows k, Rows v, float* probs,
                  MutableRows out, float* scratch) {
  const std::int64_t ld = row_len(seq);
  float* k_columns = scratch;
  const Rows v_rows = pack(seq, dim, v, k_columns + dim * ld);
  transpose_into(seq, dim, k, k_columns, ld);
  lower_row_dots(seq, dim, scale, q, k_columns, ld, probs);
  causal_softmax_rows(seq, probs, ld);
  lower_times_rows(seq, dim, probs, ld, v_rows, out);
}

void backward_pair(std::int64_t seq, std::int64_t dim, float scale, Rows q, Rows k, Rows v, const float* probs,
                   Rows grad_out, MutableRows grad_q, MutableRows grad_k, MutableRows grad_v, float* scratch) {
  const std::int64_t ld = row_len(seq);
  float* v_columns = scratch;
  float* grad_scores = v_columns + dim * ld;
  float* rows = grad_scores + seq * ld;
  const Rows grad_out_rows = pack(seq, dim, grad_out, rows);
  const Rows q_rows = pack(seq, dim, q, rows + seq * dim);
  const Rows k_rows = pack(seq, dim, k, rows + 2 * seq * dim);
  lower_transposed_times_rows(seq, dim, probs, ld, grad_out_rows, grad_v);
  transpose_into(seq, dim, v, v_columns, ld);
  lower_row_dots(seq, dim, 1.0f, grad_out_rows, v_columns, ld, grad_scores);
  causal_softmax_backward_rows(seq, scale, probs, grad_scores, ld);
  lower_times_rows(seq, dim, grad_scores, ld, k_rows, grad_q);
  lower_transposed_times_rows(seq, dim, grad_scores, ld, q_rows, grad_k);
}

}  // namespace tessera::attention_kernel

#else  // not x86: avx2::cpu_supported() is false and callers use LibTorch's attention.

namespace tessera::attention_kernel {

std::size_t forward_scratch_floats(std::int64_t, std::int64_t) { return 0; }
std::size_t backward_scratch_floats(std::int64_t, std::int64_t) { return 0; }
void forward_pair(std::int64_t, std::int64_t, float, Rows, Rows, Rows, float*, MutableRows, float*) { std::abort(); }
void backward_pair(std::int64_t, std::int64_t, float, Rows, Rows, Rows, const float*, Rows, MutableRows, MutableRows,
                   MutableRows, float*) {
  std::abort();
}

}  // namespace tessera::attention_kernel

#endif
