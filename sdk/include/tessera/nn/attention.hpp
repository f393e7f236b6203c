// Causal self-attention, tensor- and context-parallel, in the two layouts published models use:
//   FusedQkvAttention      one q|k|v projection (GPT-2's c_attn, c_proj), multi-head
//   GroupedQueryAttention  q_proj, k_proj, v_proj, o_proj (Llama, Mistral, Qwen, ...): grouped
//                          key/value heads, optional q/k/v and output biases, RMSNorm on each
//                          query and key head (Qwen3), rotary positions, a sliding window
// Under tensor parallelism a rank computes its heads (the projections into them column-parallel,
// the output projection row-parallel, tensor_parallel.hpp); under context parallelism its slice of
// every sequence, attention crossing the slices (context_parallel.hpp). Packed documents come as
// a mask (or, under context parallelism, their ids); without either, attention is causal through
// tessera::causal_attention, which picks the kernel.
// Each layer adds its splits to the model's plan (plan()): the names are the layer's own
// parameters under the module path the model registered it at.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/layer.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera::nn {

// y = x·Wᵀ + b of a row-parallel projection back to the residual stream: this rank's input units
// times its columns of the weight, summed over the ranks (scattered onto sequence slices under
// sequence parallelism), then the bias, then dropout of the stream.
TESSERA_API at::Tensor row_parallel_output(const TensorParallel& tp, const Linear& layer, const at::Tensor& x,
                                           double dropout, bool training);

// The outputs of `layers` (projections of the same input) for x from one product with their
// weights (and biases) side by side, which `cache` keeps as its `layer`'s tensor `name` for its
// life, in the dtype autocast computes in: a generation pass' products are a few rows each, where a
// call costs about as much as its arithmetic (32 rows of a 4 × 256 Llama to its q, k and v in bf16
// on 2 cores: about 95 µs as three products, 37 µs as one). Where an adapter adds a term to one of
// them, or some have a bias and others none, each layer's forward() instead.
TESSERA_API std::vector<at::Tensor> side_by_side(const std::vector<const Linear*>& layers, const at::Tensor& x,
                                                 KvCache& cache, std::size_t layer, const std::string& name);

class TESSERA_API FusedQkvAttention : public AttentionLayer {
 public:
  FusedQkvAttention(std::int64_t n_embd, std::int64_t n_head, bool bias, double dropout, TensorParallel tp = {},
                    ContextParallel cp = {});
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& inputs) override;
  // Its splits, at `prefix` ("h.0.attn."): q, k and v heads in c_attn's three blocks, c_proj's
  // input units.
  static void plan(TensorParallelPlan& plan, const std::string& prefix, bool bias);

 private:
  std::int64_t n_head_;  // this rank's
  double dropout_;
  TensorParallel tp_;
  ContextParallel cp_;
  std::shared_ptr<Linear> qkv_, out_;
};

struct AttentionSpec {
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;  // divides heads
  std::int64_t head_dim = 0;
  bool qkv_bias = false;     // Qwen2's
  bool output_bias = false;  // o_proj's (Qwen3's attention_bias sets both)
  double dropout = 0.0;      // on the attention probabilities
  // Qwen3's q_norm and k_norm: RMSNorm over head_dim of every query and key head, before the
  // rotation, with this epsilon. Unset: none.
  std::optional<double> qk_norm_eps;
  RmsWeight qk_norm_weight = RmsWeight::scale;  // Gemma's: 1 + weight
  // The softmax's scale of q·k (Gemma's query_pre_attn_scalar^-1/2). Unset: 1 / sqrt(head_dim).
  std::optional<double> scale;
  // Gemma 2's attn_logit_softcapping: scores become cap · tanh(scores / cap). Unset: none.
  std::optional<double> logit_softcap;
  // Which of the model's rotary tables the heads are rotated with (AttentionInputs::rotary).
  std::size_t rotary = 0;
  // Sliding-window attention (Mistral, Qwen2's use_sliding_window): a query sees itself and the
  // window - 1 positions before it. 0: the whole causal past.
  std::int64_t sliding_window = 0;
};

// [seq, seq] bool: key j is visible to query i when i - window < j <= i.
TESSERA_API at::Tensor causal_window_mask(std::int64_t seq, std::int64_t window, const at::Device& device);

class TESSERA_API GroupedQueryAttention : public AttentionLayer {
 public:
  GroupedQueryAttention(const AttentionSpec& spec, TensorParallel tp = {}, ContextParallel cp = {});
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& inputs) override;
  // Its splits at `prefix` ("layers.0.self_attn."): q, k, v by heads, o_proj's input units.
  static void plan(TensorParallelPlan& plan, const std::string& prefix, const AttentionSpec& spec);

 private:
  // softmax(cap · tanh(q·kᵀ · scale / cap) where `mask`) · v, in float32: the math SDPA has no
  // option for.
  at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                  double dropout) const;

  std::int64_t n_head_, n_kv_head_, head_dim_;  // this rank's heads
  double dropout_;
  std::int64_t window_;
  std::optional<double> scale_, softcap_;
  std::size_t rotary_;
  TensorParallel tp_;
  ContextParallel cp_;
  std::shared_ptr<Linear> q_, k_, v_, o_;
  std::shared_ptr<RmsNorm> q_norm_, k_norm_;  // null without qk_norm_eps
};

}  // namespace tessera::nn
