// Multi-head latent attention (MLA), DeepSeek-V2's and V3's: queries from a low-rank latent
// (q_a_proj -> q_a_layernorm -> q_b_proj, or one q_proj), keys and values from a shared latent
// (kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj) plus one rotary key part shared by every
// head; each head's query and key are a position-free part and a rotated part, its value of
// v_head_dim. The names are Hugging Face's (DeepseekV3Attention).
//
// Under tensor parallelism a rank computes its heads: q_b_proj (or q_proj) and kv_b_proj are
// split by heads, o_proj by its input units; the down projections and their norms are whole on
// every rank and their gradients, each rank's heads' part, are summed over the ranks
// (TensorParallel::shared_by_heads). Under context parallelism the heads attend across the slices
// as GroupedQueryAttention's do, the softmax scale folded into the queries.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/export.hpp"
#include "tessera/nn/layer.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera::nn {

struct LatentAttentionSpec {
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t q_lora_rank = 0;  // 0: queries from one q_proj
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;  // a head's position-free query/key part
  std::int64_t qk_rope_head_dim = 0;  // its rotated part (the rotary tables' head_dim)
  std::int64_t v_head_dim = 0;
  double norm_eps = 1e-6;          // of q_a_layernorm and kv_a_layernorm
  bool bias = false;               // attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj biases
  double softmax_scale = 0.0;      // 0: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)
  bool interleaved_rotary = true;  // DeepSeek's rope_interleave: rotated pairs (x0, x1), (x2, x3), ...
  double dropout = 0.0;            // on the attention probabilities

  std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

class TESSERA_API MultiHeadLatentAttention : public AttentionLayer {
 public:
  MultiHeadLatentAttention(const LatentAttentionSpec& spec, TensorParallel tp = {}, ContextParallel cp = {});
  // `inputs.cos`/`sin`: rotary tables of qk_rope_head_dim.
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& inputs) override;
  // Its splits at `prefix` ("layers.0.self_attn."): the up projections by heads, o_proj's inputs.
  static void plan(TensorParallelPlan& plan, const std::string& prefix, const LatentAttentionSpec& spec);

  // Interleaved rotation as DeepSeek's checkpoints lay it out: pairs (x[2i], x[2i+1]) rotated by
  // frequency i, returned de-interleaved (all first members, then all second) as transformers'
  // apply_rotary_pos_emb_interleave does. `cos`/`sin` are the rotate-half tables
  // (RotaryEmbedding::tables), whose first half holds one angle per pair.
  static at::Tensor rotate_interleaved(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

 private:
  LatentAttentionSpec spec_;
  std::int64_t heads_;  // this rank's
  TensorParallel tp_;
  ContextParallel cp_;
  std::shared_ptr<Linear> q_proj_, q_a_proj_, q_b_proj_, kv_a_proj_, kv_b_proj_, o_proj_;
  std::shared_ptr<RmsNorm> q_a_norm_, kv_a_norm_;
};

}  // namespace tessera::nn
