#include "tessera/nn/attention.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include "tessera/components/kv_cache.hpp"
#include "tessera/error.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/nn/rotary.hpp"
#include "tessera/run/precision.hpp"

namespace tessera::nn {
namespace {

// Attention over a KvCache on the CPU runs in float32 when the model computes in bf16 or fp16, its
// keys and values kept so: that is where cached_attention's kernel runs (LibTorch's fused CPU
// kernel packs reduced-precision tiles for little arithmetic in a decode step: 32 rows, 8 heads
// over 4 key/value heads, 74 keys took 0.50 ms a call in bf16), and float32 is what the GPU
// kernels accumulate in anyway. Elsewhere the tensors pass as they are.
class CachePrecision {
 public:
  explicit CachePrecision(const at::Tensor& q)
      : out_(q.scalar_type()), widen_(q.device().is_cpu() && at::isReducedFloatingType(out_)) {
    if (widen_) no_autocast_.emplace(q.device());  // autocast would narrow the products again
  }
  at::Tensor in(const at::Tensor& t) const { return widen_ ? t.to(at::kFloat) : t; }
  at::Tensor out(const at::Tensor& y) const { return y.to(out_); }

 private:
  at::ScalarType out_;
  bool widen_;
  std::optional<NoAutocast> no_autocast_;
};

}  // namespace

std::vector<at::Tensor> side_by_side(const std::vector<const Linear*>& layers, const at::Tensor& x, KvCache& cache,
                                     std::size_t layer, const std::string& name) {
  std::vector<at::Tensor> out;
  const bool adapted = std::any_of(layers.begin(), layers.end(), [](const Linear* l) { return l->adapted(); });
  const bool biased = layers.front()->bias.defined();
  const bool mixed =
      std::any_of(layers.begin(), layers.end(), [&](const Linear* l) { return l->bias.defined() != biased; });
  if (adapted || mixed) {
    for (const Linear* l : layers) out.push_back(l->forward(x));
    return out;
  }
  const auto fused = [&](bool bias) {
    return [&layers, bias] {
      std::vector<at::Tensor> parts;
      for (const Linear* l : layers) parts.push_back(bias ? l->bias : l->weight);
      at::Tensor joined = at::cat(parts).detach();
      const c10::DeviceType type = joined.device().type();
      return at::autocast::is_autocast_enabled(type) ? joined.to(at::autocast::get_autocast_dtype(type)) : joined;
    };
  };
  const at::Tensor weight = cache.derived(layer, name + ".weight", fused(false));
  const at::Tensor y = at::linear(x, weight, biased ? cache.derived(layer, name + ".bias", fused(true)) : at::Tensor());
  std::int64_t first = 0;
  for (const Linear* l : layers) {
    out.push_back(y.narrow(-1, first, l->weight.size(0)));
    first += l->weight.size(0);
  }
  return out;
}

at::Tensor row_parallel_output(const TensorParallel& tp, const Linear& layer, const at::Tensor& x, double dropout,
                               bool training) {
  if (tp.size() == 1) return dropout > 0 ? at::dropout(layer.forward(x), dropout, training) : layer.forward(x);
  at::Tensor y = tp.row_output(at::linear(x, layer.weight));
  if (layer.bias.defined()) y = y + tp.replicated(layer.bias);
  return tp.stream_dropout(y, dropout, training);
}

FusedQkvAttention::FusedQkvAttention(std::int64_t n_embd, std::int64_t n_head, bool bias, double dropout,
                                     TensorParallel tp, ContextParallel cp)
    : n_head_(tp.local(n_head)),
      dropout_(dropout),
      tp_(std::move(tp)),
      cp_(std::move(cp)),
      qkv_(register_module("c_attn", std::make_shared<Linear>(n_embd, 3 * tp_.local(n_embd), bias))),
      out_(register_module("c_proj", std::make_shared<Linear>(tp_.local(n_embd), n_embd, bias))) {}

at::Tensor FusedQkvAttention::forward(const at::Tensor& x, const AttentionInputs& inputs) {
  const double attn_dropout = is_training() ? dropout_ : 0.0;
  const at::Tensor qkv = qkv_->forward(tp_.column_input(x));  // this rank's heads, the whole sequence
  at::Tensor y;
  {
    // Attention dropout on this rank's own heads: masks of its own.
    std::optional<ShardedRandomness> own;
    if (attn_dropout > 0) own.emplace(tp_, qkv.device());
    const std::int64_t batch = qkv.size(0), seq = qkv.size(1), embd = qkv.size(2) / 3;
    const auto heads = [&] {
      // [B, T, 3C] -> three [B, H, T, C/H]
      return qkv.view({batch, seq, 3, n_head_, embd / n_head_}).permute({2, 0, 3, 1, 4}).unbind(0);
    };
    if (inputs.cache) {
      // This pass' keys and values join the cache's; each query sees the keys its position allows.
      const std::vector<at::Tensor> h = heads();
      const CachePrecision precision(h[0]);
      const std::vector<at::Tensor> kv =
          inputs.cache->append(inputs.cache_layer, {precision.in(h[1]), precision.in(h[2])});
      y = precision
              .out(cached_attention(precision.in(h[0]), kv[0], kv[1], inputs.cache->visible()))
              .transpose(1, 2)
              .contiguous()
              .view({batch, seq, embd});
    } else if (cp_.size() > 1) {
      const std::vector<at::Tensor> h = heads();
      y = cp_.attend(h[0], h[1], h[2], inputs.documents).transpose(1, 2).contiguous().view({batch, seq, embd});
    } else if (inputs.mask.defined()) {
      const std::vector<at::Tensor> h = heads();
      y = at::scaled_dot_product_attention(h[0], h[1], h[2], inputs.mask, attn_dropout, /*is_causal=*/false)
              .transpose(1, 2)
              .contiguous()
              .view({batch, seq, embd});
    } else {
      y = causal_self_attention(qkv, n_head_, attn_dropout);
    }
  }
  return row_parallel_output(tp_, *out_, y, dropout_, is_training());
}

void FusedQkvAttention::plan(TensorParallelPlan& plan, const std::string& prefix, bool bias) {
  plan[prefix + "c_attn.weight"] = TensorShard::columns(3);
  if (bias) plan[prefix + "c_attn.bias"] = TensorShard{0, 3};
  plan[prefix + "c_proj.weight"] = TensorShard::rows();
}

at::Tensor causal_window_mask(std::int64_t seq, std::int64_t window, const at::Device& device) {
  const at::Tensor query = at::arange(seq, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(1);
  const at::Tensor key = query.view({1, seq});
  return key.le(query).logical_and(key.gt(query - window));
}

GroupedQueryAttention::GroupedQueryAttention(const AttentionSpec& s, TensorParallel tp, ContextParallel cp)
    : n_head_(tp.local(s.heads)),
      n_kv_head_(tp.local(s.kv_heads)),
      head_dim_(s.head_dim),
      dropout_(s.dropout),
      window_(s.sliding_window),
      scale_(s.scale),
      softcap_(s.logit_softcap),
      rotary_(s.rotary),
      tp_(std::move(tp)),
      cp_(std::move(cp)),
      q_(register_module("q_proj", std::make_shared<Linear>(s.hidden, n_head_ * s.head_dim, s.qkv_bias))),
      k_(register_module("k_proj", std::make_shared<Linear>(s.hidden, n_kv_head_ * s.head_dim, s.qkv_bias))),
      v_(register_module("v_proj", std::make_shared<Linear>(s.hidden, n_kv_head_ * s.head_dim, s.qkv_bias))),
      o_(register_module("o_proj", std::make_shared<Linear>(n_head_ * s.head_dim, s.hidden, s.output_bias))) {
  if (s.qk_norm_eps) {
    q_norm_ = register_module(
        "q_norm", std::make_shared<RmsNorm>(s.head_dim, *s.qk_norm_eps, tp_, NormOver::heads, s.qk_norm_weight));
    k_norm_ = register_module(
        "k_norm", std::make_shared<RmsNorm>(s.head_dim, *s.qk_norm_eps, tp_, NormOver::heads, s.qk_norm_weight));
  }
  if ((window_ > 0 || softcap_) && cp_.size() > 1) {
    // check_context_parallel refuses it first with the field's name; this guards other callers.
    throw Error("GroupedQueryAttention: a sliding window or softcapped scores under context parallelism are not "
                "supported");
  }
}

at::Tensor GroupedQueryAttention::forward(const at::Tensor& input, const AttentionInputs& inputs) {
  const at::Tensor x = tp_.column_input(input);  // the whole sequence
  const std::int64_t batch = x.size(0), seq = x.size(1);
  // [B, T, H·D] -> [B, H, T, D], each head normalised and rotated where the model says so
  const auto heads = [&](const at::Tensor& t, std::int64_t n, const std::shared_ptr<RmsNorm>& norm, bool rotate) {
    at::Tensor h = t.view({batch, seq, n, head_dim_});
    if (norm) h = norm->forward(h);
    h = h.transpose(1, 2);
    const RotaryTables* tables = rotate ? inputs.rotary_at(rotary_) : nullptr;
    return tables ? RotaryEmbedding::apply(h, tables->cos, tables->sin) : h;
  };
  const std::vector<at::Tensor> projected =
      inputs.cache ? side_by_side({q_.get(), k_.get(), v_.get()}, x, *inputs.cache, inputs.cache_layer, "qkv_proj")
                   : std::vector<at::Tensor>{q_->forward(x), k_->forward(x), v_->forward(x)};
  const at::Tensor q = heads(projected[0], n_head_, q_norm_, true);
  at::Tensor k = heads(projected[1], n_kv_head_, k_norm_, true);
  at::Tensor v = heads(projected[2], n_kv_head_, nullptr, false);
  if (inputs.cache) {
    // This pass' keys and values join the cache's; each query sees the keys its position (and
    // the window) allows.
    at::Tensor y;
    {
      const CachePrecision precision(q);
      const std::vector<at::Tensor> kv = inputs.cache->append(inputs.cache_layer, {precision.in(k), precision.in(v)});
      const at::Tensor seen = inputs.cache->visible(window_);
      const at::Tensor wide_q = precision.in(q);
      y = precision.out(softcap_ ? softcapped_attention(wide_q, kv[0], kv[1], seen, 0.0)
                                 : cached_attention(wide_q, kv[0], kv[1], seen, scale_));
    }
    return row_parallel_output(tp_, *o_, y.transpose(1, 2).reshape({batch, seq, n_head_ * head_dim_}), 0.0,
                               is_training());
  }
  const double dropout = is_training() ? dropout_ : 0.0;
  at::Tensor mask = inputs.mask;
  if (window_ > 0 && window_ < seq) {
    const at::Tensor band = causal_window_mask(seq, window_, x.device());
    mask = mask.defined() ? mask.logical_and(band) : band;
  }
  at::Tensor y;
  {
    // Attention dropout on this rank's own heads: masks of its own.
    std::optional<ShardedRandomness> own;
    if (dropout > 0) own.emplace(tp_, q.device());
    if (cp_.size() > 1) {
      // Context-parallel attention scales by 1 / sqrt(head_dim): a scale of its own is folded into q.
      const at::Tensor scaled = scale_ ? q * (*scale_ * std::sqrt(static_cast<double>(head_dim_))) : q;
      y = cp_.attend(scaled, k, v, inputs.documents);
    } else if (softcap_) {
      y = softcapped_attention(q, k, v, mask.defined() ? mask : causal_window_mask(seq, seq, x.device()), dropout);
    } else if (mask.defined() || scale_) {
      // No mask and a scale of its own: causal through the fused kernel's is_causal.
      const std::optional<at::Tensor> given = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
      y = at::scaled_dot_product_attention(q, k, v, given, dropout, /*is_causal=*/!mask.defined(), scale_,
                                           /*enable_gqa=*/n_kv_head_ != n_head_);
    } else {
      y = causal_attention(q, k, v, dropout);
    }
  }
  return row_parallel_output(tp_, *o_, y.transpose(1, 2).reshape({batch, seq, n_head_ * head_dim_}), 0.0,
                             is_training());
}

at::Tensor GroupedQueryAttention::softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& mask, double dropout) const {
  // Scores in float32: tanh saturates, and bf16's 8 bits would make the cap coarse.
  const std::int64_t groups = n_head_ / n_kv_head_;
  const at::Tensor keys = groups > 1 ? k.repeat_interleave(groups, 1) : k;
  const at::Tensor values = groups > 1 ? v.repeat_interleave(groups, 1) : v;
  const double scale = scale_ ? *scale_ : 1.0 / std::sqrt(static_cast<double>(head_dim_));
  at::Tensor scores = at::matmul(q.to(at::kFloat), keys.to(at::kFloat).transpose(-2, -1)) * scale;
  scores = at::tanh(scores / *softcap_) * *softcap_;
  if (mask.defined()) scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  at::Tensor probabilities = at::softmax(scores, -1);
  if (dropout > 0) probabilities = at::dropout(probabilities, dropout, true);
  return at::matmul(probabilities.to(values.scalar_type()), values);
}

void GroupedQueryAttention::plan(TensorParallelPlan& plan, const std::string& prefix, const AttentionSpec& spec) {
  for (const char* column : {"q_proj", "k_proj", "v_proj"}) {
    plan[prefix + column + ".weight"] = TensorShard::columns();
    if (spec.qkv_bias) plan[prefix + column + ".bias"] = TensorShard{0, 1};
  }
  // o_proj's bias stays whole on every rank; so do the per-head norms, their gradients summed.
  if (spec.qk_norm_eps) {
    plan[prefix + "q_norm.weight"] = TensorShard::whole_for_heads();
    plan[prefix + "k_norm.weight"] = TensorShard::whole_for_heads();
  }
  plan[prefix + "o_proj.weight"] = TensorShard::rows();
}

}  // namespace tessera::nn
