// The CPU kernel behind tessera::cached_attention (cached_attention.cpp): a few queries' softmax
// attention over the keys a KvCache holds, for one (batch, query head) pair, in float32 with
// AVX2 + FMA (callers check avx2::cpu_supported() first). Plain pointers and row strides, no
// LibTorch: the caller lays the tensors out and runs pairs on its threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "causal_attention_kernel.hpp"

namespace tessera::attention_kernel {

// Floats of scratch one call of cached_pair needs.
std::size_t cached_scratch_floats(std::int64_t keys);

// For each of the `queries` rows q_i: o_i = Σ_j p_ij · v_j, p_i = softmax(scale · q_i·k_j) over the
// keys j row i sees: visible[i · visible_stride + j] where `visible` is given, every key where it
// is null. A row that sees no key gets zeros.
void cached_pair(std::int64_t queries, std::int64_t keys, std::int64_t dim, float scale, Rows q, Rows k, Rows v,
                 const bool* visible, std::int64_t visible_stride, MutableRows out, float* scratch);

}  // namespace tessera::attention_kernel
