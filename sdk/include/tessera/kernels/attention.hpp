// Causal self-attention for models' attention layers: softmax(q·kᵀ/√D + causal mask)·v; and
// attention over a KvCache's keys for generation (cached_attention, at the end).
//
// One call for every model (gpt, gpt_moe, llama, a plugin's own): it picks the kernel. On the CPU
// with AVX2, Tessera's own kernel computes short sequences (up to kCpuAttentionMaxSeq) about three
// times faster than LibTorch's CPU flash attention (tools/bench/attention); everywhere else
// (GPUs, dropout, longer sequences, other head sizes) it is at::scaled_dot_product_attention.
// Both give the same values and gradients within float rounding (the kernel computes in float32
// and keeps the attention probabilities for backward: B·H·T·T floats per call with grad).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "tessera/export.hpp"

namespace tessera {

// The longest sequence the CPU kernel takes; beyond it the saved probabilities outgrow the
// caches and LibTorch's tiled kernel, which saves none, is the better choice.
inline constexpr std::int64_t kCpuAttentionMaxSeq = 256;

// q: [batch, heads, seq, head_dim]; k, v: [batch, kv_heads, seq, head_dim] with heads a multiple
// of kv_heads (grouped-query attention when smaller: query head h reads key/value head
// h / (heads / kv_heads), as scaled_dot_product_attention's enable_gqa). `dropout`: the
// probability of dropping an attention weight, 0 outside training. Returns [batch, heads, seq,
// head_dim] in q's dtype (its memory laid out as [batch, seq, heads, head_dim], so merging the
// heads back with transpose(1, 2) costs no copy).
TESSERA_API at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        double dropout = 0.0);

// Whether causal_attention(q, k, v, dropout) runs on Tessera's CPU kernel: CPU tensors of
// float32 or bfloat16, seq in [1, kCpuAttentionMaxSeq], head_dim a multiple of 8, no dropout, and
// a CPU with AVX2 and FMA.
TESSERA_API bool causal_attention_uses_cpu_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  double dropout = 0.0);

// The same for a model whose one projection makes the query, key and value heads side by side
// (GPT-2's c_attn): `qkv` is [batch, seq, 3 · heads · head_dim] (all query heads, then all key
// heads, then all value heads); returns [batch, seq, heads · head_dim], the heads merged. On the
// CPU kernel the heads are read in place and qkv's gradient comes back in one piece, without the
// copies that splitting the heads off and merging them back cost around causal_attention.
// Throws tessera::Error when qkv's last size is not a multiple of 3 · heads.
TESSERA_API at::Tensor causal_self_attention(const at::Tensor& qkv, std::int64_t heads, double dropout = 0.0);

// Whether causal_self_attention(qkv, heads, dropout) runs on Tessera's CPU kernel (the conditions
// of causal_attention_uses_cpu_kernel).
TESSERA_API bool causal_self_attention_uses_cpu_kernel(const at::Tensor& qkv, std::int64_t heads,
                                                       double dropout = 0.0);

// The most queries a row cached_attention's CPU kernel takes: a decode step's one, a few drafted
// tokens; a longer pass (a prompt's prefill) is a matrix product, which LibTorch's kernel tiles.
inline constexpr std::int64_t kCpuCachedAttentionMaxQueries = 16;

// Attention of a pass' queries over the keys and values a KvCache holds (generation's decode):
// softmax(scale · q·kᵀ where `visible`) · v. q: [batch, heads, queries, head_dim]; k, v: [batch,
// kv_heads, keys, head_dim] with heads a multiple of kv_heads (query head h reads key/value head
// h / (heads / kv_heads)); `visible`: bool, broadcastable to [batch, heads, queries, keys], or
// undefined for every key; `scale`: 1 / sqrt(head_dim) when not given. Returns [batch, heads,
// queries, head_dim] in q's dtype (memory laid out as [batch, queries, heads, head_dim] on the
// kernel). On the CPU with AVX2 and autocast off, float32 inputs that need no gradient and at
// most kCpuCachedAttentionMaxQueries queries run on Tessera's kernel (a row that sees no key gets
// zeros; an unseen key's value is never read); everything else is
// at::scaled_dot_product_attention with enable_gqa.
TESSERA_API at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& visible, std::optional<double> scale = std::nullopt);

// Whether cached_attention(q, k, v, visible) runs on Tessera's CPU kernel.
TESSERA_API bool cached_attention_uses_cpu_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& visible);

}  // namespace tessera
