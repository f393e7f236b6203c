// The CPU kernel behind tessera::causal_attention (attention.cpp): one (batch, head) pair's causal
// softmax attention, forward and backward, in float32 with AVX2 + FMA (callers check
// avx2::cpu_supported() first). Plain pointers and row
// strides, no LibTorch: the caller lays the tensors out and runs pairs on its threads.
//
// Every matrix here is T rows; a row's elements are contiguous. The probabilities P are T rows of
// `row_len(T)` floats, lower-triangular: entries right of the diagonal are exactly zero, so
// the products below may run whole vectors past the diagonal without reading anything undefined.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::attention_kernel {

// The length of a row of P and of the kernel's score rows: T rounded up to whole vectors (8
// floats), plus one vector so that a column's entries, read down the rows, spread over the
// cache's sets instead of landing in a few (a power-of-two row length would alias).
inline std::int64_t row_len(std::int64_t seq) { return (seq + 7) / 8 * 8 + 8; }

// Head sizes the kernel takes: whole vectors.
inline bool head_dim_supported(std::int64_t dim) { return dim > 0 && dim % 8 == 0; }

// A [T, D] matrix of one pair: its first element and the distance between its rows (in floats).
struct Rows {
  const float* data;
  std::int64_t stride;
};
struct MutableRows {
  float* data;
  std::int64_t stride;
};

// Floats of scratch one call of forward_pair or backward_pair needs.
std::size_t forward_scratch_floats(std::int64_t seq, std::int64_t dim);
std::size_t backward_scratch_floats(std::int64_t seq, std::int64_t dim);

// P = softmax(scale · Q·Kᵀ, causal) into `probs` (T × row_len(T)), O = P·V into `out`.
void forward_pair(std::int64_t seq, std::int64_t dim, float scale, Rows q, Rows k, Rows v, float* probs,
                  MutableRows out, float* scratch);

// From P and dO: dV = Pᵀ·dO, dS = P ∘ (dO·Vᵀ − rowsum(P ∘ dO·Vᵀ)) · scale, dQ = dS·K, dK = dSᵀ·Q.
void backward_pair(std::int64_t seq, std::int64_t dim, float scale, Rows q, Rows k, Rows v, const float* probs,
                   Rows grad_out, MutableRows grad_q, MutableRows grad_k, MutableRows grad_v, float* scratch);

}  // namespace tessera::attention_kernel
