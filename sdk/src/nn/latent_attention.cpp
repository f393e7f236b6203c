#include "tessera/nn/latent_attention.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/components/kv_cache.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/rotary.hpp"

namespace tessera::nn {

MultiHeadLatentAttention::MultiHeadLatentAttention(const LatentAttentionSpec& s, TensorParallel tp, ContextParallel cp)
    : spec_(s), heads_(tp.local(s.heads)), tp_(std::move(tp)), cp_(std::move(cp)) {
  if (s.kv_lora_rank < 1 || s.qk_rope_head_dim < 2 || s.qk_rope_head_dim % 2 != 0 || s.v_head_dim < 1 ||
      s.qk_nope_head_dim < 0) {
    throw Error("MultiHeadLatentAttention: kv_lora_rank >= 1, an even qk_rope_head_dim and v_head_dim >= 1 are needed");
  }
  if (s.q_lora_rank > 0) {
    // The down projections are not adaptable: they are applied through their weights directly
    // (TensorParallel::shared_by_heads), where an adapter's path would be bypassed.
    q_a_proj_ = register_module("q_a_proj", std::make_shared<Linear>(s.hidden, s.q_lora_rank, s.bias, false));
    q_a_norm_ =
        register_module("q_a_layernorm", std::make_shared<RmsNorm>(s.q_lora_rank, s.norm_eps, tp_, NormOver::heads));
    q_b_proj_ = register_module("q_b_proj", std::make_shared<Linear>(s.q_lora_rank, heads_ * s.qk_head_dim(), false));
  } else {
    q_proj_ = register_module("q_proj", std::make_shared<Linear>(s.hidden, heads_ * s.qk_head_dim(), false));
  }
  kv_a_proj_ = register_module("kv_a_proj_with_mqa",
                               std::make_shared<Linear>(s.hidden, s.kv_lora_rank + s.qk_rope_head_dim, s.bias, false));
  kv_a_norm_ =
      register_module("kv_a_layernorm", std::make_shared<RmsNorm>(s.kv_lora_rank, s.norm_eps, tp_, NormOver::heads));
  kv_b_proj_ = register_module(
      "kv_b_proj", std::make_shared<Linear>(s.kv_lora_rank, heads_ * (s.qk_nope_head_dim + s.v_head_dim), false));
  o_proj_ = register_module("o_proj", std::make_shared<Linear>(heads_ * s.v_head_dim, s.hidden, s.bias));
}

at::Tensor MultiHeadLatentAttention::rotate_interleaved(const at::Tensor& x, const at::Tensor& cos,
                                                        const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor c = cos.narrow(-1, 0, half), s = sin.narrow(-1, 0, half);
  const at::Tensor first = x.slice(-1, 0, x.size(-1), 2), second = x.slice(-1, 1, x.size(-1), 2);
  return at::cat({first * c - second * s, second * c + first * s}, -1);
}

at::Tensor MultiHeadLatentAttention::forward(const at::Tensor& input, const AttentionInputs& inputs) {
  const LatentAttentionSpec& s = spec_;
  const at::Tensor x = tp_.column_input(input);  // the whole sequence
  const std::int64_t batch = x.size(0), seq = x.size(1);
  // A down projection whole on every rank, its gradient summed over the ranks' heads.
  const auto shared = [&](const Linear& layer, const at::Tensor& in) {
    return at::linear(in, tp_.shared_by_heads(layer.weight),
                      layer.bias.defined() ? tp_.shared_by_heads(layer.bias) : layer.bias);
  };
  const auto rotate = [&](const at::Tensor& h) {
    const RotaryTables* tables = inputs.rotary_at(0);
    if (!tables) throw Error("MultiHeadLatentAttention: the model gives no rotary tables");
    return s.interleaved_rotary ? rotate_interleaved(h, tables->cos, tables->sin)
                                : RotaryEmbedding::apply(h, tables->cos, tables->sin);
  };

  const at::Tensor q_all = q_proj_ ? q_proj_->forward(x) : q_b_proj_->forward(q_a_norm_->forward(shared(*q_a_proj_, x)));
  const at::Tensor q_heads = q_all.view({batch, seq, heads_, s.qk_head_dim()}).transpose(1, 2);
  const at::Tensor q = at::cat({q_heads.narrow(-1, 0, s.qk_nope_head_dim),
                                rotate(q_heads.narrow(-1, s.qk_nope_head_dim, s.qk_rope_head_dim))},
                               -1);

  const at::Tensor compressed = shared(*kv_a_proj_, x);
  const at::Tensor latent = kv_a_norm_->forward(compressed.narrow(-1, 0, s.kv_lora_rank));
  const at::Tensor k_rot =
      rotate(compressed.narrow(-1, s.kv_lora_rank, s.qk_rope_head_dim).view({batch, 1, seq, s.qk_rope_head_dim}));
  // Generation caches what DeepSeek caches, the latent and the rotary key (not the heads' keys and
  // values), and expands every slot's each pass.
  at::Tensor kept_latent = latent, kept_rot = k_rot, seen;
  const bool cached = inputs.cache != nullptr;
  if (cached) {
    const std::vector<at::Tensor> kept = inputs.cache->append(inputs.cache_layer, {latent.unsqueeze(1), k_rot});
    kept_latent = kept[0].squeeze(1);
    kept_rot = kept[1];
    seen = inputs.cache->visible();
  }
  const std::int64_t keys = kept_latent.size(1);
  const at::Tensor kv = kv_b_proj_->forward(kept_latent)
                            .view({batch, keys, heads_, s.qk_nope_head_dim + s.v_head_dim})
                            .transpose(1, 2);
  const at::Tensor k =
      at::cat({kv.narrow(-1, 0, s.qk_nope_head_dim), kept_rot.expand({batch, heads_, keys, -1})}, -1);
  const at::Tensor v = kv.narrow(-1, s.qk_nope_head_dim, s.v_head_dim);

  const double scale = s.softmax_scale > 0 ? s.softmax_scale : 1.0 / std::sqrt(static_cast<double>(s.qk_head_dim()));
  const double dropout = is_training() ? s.dropout : 0.0;
  at::Tensor y;
  {
    std::optional<ShardedRandomness> own;
    if (dropout > 0) own.emplace(tp_, q.device());
    if (cached) {
      const std::optional<at::Tensor> mask = seen.defined() ? std::optional<at::Tensor>(seen) : std::nullopt;
      y = at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, scale);
    } else if (cp_.size() > 1) {
      // The exchanges' kernels want one head size D for queries, keys and values: the smaller
      // padded with zeros (which changes no score and no kept output), the padding of the output
      // dropped; they attend at 1/sqrt(D), so the scale is folded into the queries.
      const std::int64_t size = std::max(s.qk_head_dim(), s.v_head_dim);
      const auto padded = [&](const at::Tensor& t) {
        return t.size(-1) < size ? at::constant_pad_nd(t, {0, size - t.size(-1)}) : t.contiguous();
      };
      y = cp_.attend(padded(q) * (scale * std::sqrt(static_cast<double>(size))), padded(k), padded(v),
                     inputs.documents)
              .narrow(-1, 0, s.v_head_dim);
    } else {
      const std::optional<at::Tensor> mask =
          inputs.mask.defined() ? std::optional<at::Tensor>(inputs.mask) : std::nullopt;
      y = at::scaled_dot_product_attention(q, k, v, mask, dropout, /*is_causal=*/!mask, scale);
    }
  }
  return row_parallel_output(tp_, *o_proj_, y.transpose(1, 2).reshape({batch, seq, heads_ * s.v_head_dim}), 0.0,
                             is_training());
}

void MultiHeadLatentAttention::plan(TensorParallelPlan& plan, const std::string& prefix, const LatentAttentionSpec& spec) {
  plan[prefix + (spec.q_lora_rank > 0 ? "q_b_proj.weight" : "q_proj.weight")] = TensorShard::columns();
  plan[prefix + "kv_b_proj.weight"] = TensorShard::columns();
  plan[prefix + "o_proj.weight"] = TensorShard::rows();
  // The down projections and their norms stay whole on every rank, their gradients summed; so
  // does o_proj's bias (added after the reduction).
  std::vector<std::string> shared = {"kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight"};
  if (spec.bias) shared.push_back("kv_a_proj_with_mqa.bias");
  if (spec.q_lora_rank > 0) {
    shared.insert(shared.end(), {"q_a_proj.weight", "q_a_layernorm.weight"});
    if (spec.bias) shared.push_back("q_a_proj.bias");
  }
  for (const std::string& name : shared) plan[prefix + name] = TensorShard::whole_for_heads();
}

}  // namespace tessera::nn
