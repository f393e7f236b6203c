// The GPT-2 pieces model/gpt and model/gpt_moe share: a layer norm with an optional bias, causal
// self-attention and the dense 4x GELU MLP. Parameter names follow GPT-2 (c_attn, c_proj, c_fc),
// so exports and checkpoints of both models read the same way. Header-only: each model plugin
// compiles its own copy (plugins share no code at run time).
//
// Tensor parallelism (tessera/parallel/tensor_parallel.hpp): attention is split by heads (c_attn
// column-parallel in its q, k, v blocks, c_proj row-parallel), the MLP by hidden units (c_fc
// column, c_proj row); each piece is built at its local size and adds its splits to the model's
// plan (attention_plan, mlp_plan). With one rank everything is the plain layer.
#pragma once

#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpt_architecture.hpp"
#include "tessera/attention.hpp"
#include "tessera/linear.hpp"
#include "tessera/linear_gelu.hpp"
#include "tessera/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera::gpt_parts {

// Parameters come from tessera::new_parameter: on the meta device while the host defers
// initialisation (tessera/deferred_init.hpp), else uninitialised on the CPU; the models write
// their initial values. `fill` gives a constant at once when not deferring (norms' ones, zero
// biases), for models that initialise only their random tensors themselves.
inline at::Tensor parameter(at::IntArrayRef sizes, double fill) {
  at::Tensor p = new_parameter(sizes);
  if (!p.is_meta()) p.fill_(fill);
  return p;
}

// The name of each of a model's parameters by identity, for initialize_parameters, which gets
// tensors (possibly materialised from the meta device, same TensorImpl) rather than names.
class ParameterNames {
 public:
  explicit ParameterNames(const torch::nn::Module& model) {
    for (const auto& item : model.named_parameters()) names_[item.value().unsafeGetTensorImpl()] = item.key();
  }
  // Throws naming `model_kind` when `p` is not one of the model's parameters.
  const std::string& of(const at::Tensor& p, const char* model_kind) const {
    auto it = names_.find(p.unsafeGetTensorImpl());
    if (it == names_.end()) {
      throw Error(std::string(model_kind) + ": initialize_parameters got a tensor that is not its parameter");
    }
    return it->second;
  }

 private:
  std::map<const c10::TensorImpl*, std::string> names_;
};

// GPT-2 init, parameter by parameter, for `params` of `model`: normal(0, init_std) weights and
// embeddings, residual output projections (every "c_proj.weight": attention, MLP, experts)
// normal(0, residual_std) to keep the residual stream's variance flat, ones and zeros for norms
// and biases. Each tensor's values come from its own generator (the model's init seed and its
// name), drawn on the CPU for the whole parameter and then cut to this rank's part (`plan`, `tp`):
// the same values whatever subset is initialised, in whatever order, on whatever device (fsdp
// initialises its shards unit by unit), whatever the tensor-parallel ranks.
inline void initialize_gpt2_parameters(const torch::nn::Module& model, const char* model_kind,
                                       const std::vector<at::Tensor>& params, std::uint64_t init_seed,
                                       double init_std, double residual_std, const TensorParallelPlan& plan = {},
                                       const TensorParallel& tp = {}, ShardRanks experts = {}) {
  c10::NoGradGuard no_grad;
  const ParameterNames names(model);
  for (const at::Tensor& p : params) {
    const std::string& name = names.of(p, model_kind);
    const auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with(".bias")) {
      p.zero_();
    } else if (name.rfind("ln_f.", 0) == 0 || name.find(".ln_") != std::string::npos) {
      p.fill_(1.0);
    } else {
      const TensorShard shard = shard_in(plan, name);
      const ShardRanks ranks = shard.experts ? experts : tp.ranks();
      at::Tensor values = at::empty(whole_shape(p.sizes(), shard, ranks), at::kFloat);
      values.normal_(0.0, ends_with("c_proj.weight") ? residual_std : init_std, init_generator(init_seed, name));
      p.copy_(part_of(values, shard, ranks));
    }
  }
}

// The number of elements of the whole model's parameters (each split one counted whole): what
// FLOPs per token are computed from, whatever the tensor-parallel ranks.
inline std::int64_t whole_parameter_count(const torch::nn::Module& model, const TensorParallelPlan& plan,
                                          const TensorParallel& tp, std::int64_t expert_ranks = 1) {
  std::int64_t n = 0;
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    const TensorShard shard = shard_in(plan, item.key());
    n += item.value().numel() * (shard.replicated() ? 1 : shard.experts ? expert_ranks : tp.size());
  }
  return n;
}

// Where block `block` of the whole model sits among this rank's blocks (`held`: their indices,
// increasing); a pipeline stage holds some blocks only.
inline std::size_t local_position(const std::vector<std::int64_t>& held, std::int64_t block) {
  const auto it = std::lower_bound(held.begin(), held.end(), block);
  if (it == held.end() || *it != block) throw Error("block " + std::to_string(block) + " is not on this pipeline stage");
  return static_cast<std::size_t>(it - held.begin());
}

// A GPT-2 model's parameters, whole, from its config (a pipeline stage holds some of them only):
// the token and position embeddings, n_layer blocks (two norms, q/k/v and output projections,
// a 4x MLP) and the final norm. `dense_mlp` false: the blocks' MLPs are not counted (the caller
// adds its own).
inline std::int64_t gpt_parameter_count(const GptArchitecture& c, bool dense_mlp = true) {
  const std::int64_t C = c.n_embd, norm = c.bias ? 2 * C : C;
  const std::int64_t attention = 4 * C * C + (c.bias ? 4 * C : 0);
  const std::int64_t mlp = dense_mlp ? 8 * C * C + (c.bias ? 5 * C : 0) : 0;
  return c.vocab_size * C + c.max_seq_len * C + c.n_layer * (2 * norm + attention + mlp) + norm;
}

// y = x·Wᵀ + b: torch::nn::Linear without allocating at construction (its reset() would), which
// adapters can extend (tessera/linear.hpp).
using Affine = tessera::Linear;

// A lookup table (token or position embedding): torch::nn::Embedding without allocating.
class Embedding : public torch::nn::Module {
 public:
  Embedding(std::int64_t count, std::int64_t dim) { weight = register_parameter("weight", new_parameter({count, dim})); }
  at::Tensor forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

  at::Tensor weight;
};

inline std::shared_ptr<Affine> linear_layer(std::int64_t in, std::int64_t out, bool bias) {
  return std::make_shared<Affine>(in, out, bias);
}

// torch::nn::LayerNorm has no bias switch, so this one holds its own affine parameters. Under
// sequence parallelism it normalises this rank's slice of the sequence, its gradients summed
// over the ranks.
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(std::int64_t dim, bool bias, TensorParallel tp = {}) : dim_(dim), tp_(std::move(tp)) {
    weight_ = register_parameter("weight", parameter({dim}, 1.0));
    if (bias) bias_ = register_parameter("bias", parameter({dim}, 0.0));
  }
  at::Tensor forward(const at::Tensor& x) {
    return at::layer_norm(x, {dim_}, tp_.replicated(weight_), bias_.defined() ? tp_.replicated(bias_) : bias_);
  }

 private:
  std::int64_t dim_;
  TensorParallel tp_;
  at::Tensor weight_, bias_;  // bias_ stays undefined when bias is off
};

// A row-parallel projection back to the residual stream: this rank's input units times its
// columns of the weight, summed over the ranks (scattered onto sequence slices under sequence
// parallelism), then the bias, then dropout of the stream.
inline at::Tensor row_parallel_output(const TensorParallel& tp, const Affine& layer, const at::Tensor& x,
                                      double dropout, bool training) {
  if (tp.size() == 1) return at::dropout(layer.forward(x), dropout, training);
  at::Tensor y = tp.row_output(at::linear(x, layer.weight));
  if (layer.bias.defined()) y = y + tp.replicated(layer.bias);
  return tp.stream_dropout(y, dropout, training);
}

class CausalSelfAttention : public torch::nn::Module {
 public:
  // `cp`: under context parallelism x is this rank's slice of the sequence and attention crosses
  // the slices (tessera/parallel/context_parallel.hpp).
  CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, bool bias, double dropout, TensorParallel tp = {},
                      ContextParallel cp = {})
      : n_head_(tp.local(n_head)),
        dropout_(dropout),
        tp_(std::move(tp)),
        cp_(std::move(cp)),
        qkv_(register_module("c_attn", linear_layer(n_embd, 3 * tp_.local(n_embd), bias))),
        out_(register_module("c_proj", linear_layer(tp_.local(n_embd), n_embd, bias))) {}

  // `mask` (optional, [batch, 1, seq, seq] bool): which keys each query may see; causal without.
  // Under context parallelism `documents` (optional, [batch, whole seq]) stands for the mask.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask = {}, const at::Tensor& documents = {}) {
    const double attn_dropout = is_training() ? dropout_ : 0.0;
    const at::Tensor qkv = qkv_->forward(tp_.column_input(x));  // this rank's heads, the whole sequence
    at::Tensor y;
    {
      // Attention dropout on this rank's own heads: masks of its own.
      std::optional<ShardedRandomness> own;
      if (attn_dropout > 0) own.emplace(tp_, qkv.device());
      if (cp_.size() > 1) {
        const std::int64_t batch = qkv.size(0), seq = qkv.size(1), embd = qkv.size(2) / 3;
        std::vector<at::Tensor> heads =
            qkv.view({batch, seq, 3, n_head_, embd / n_head_}).permute({2, 0, 3, 1, 4}).unbind(0);
        y = cp_.attend(heads[0], heads[1], heads[2], documents).transpose(1, 2).contiguous().view({batch, seq, embd});
      } else if (mask.defined()) {
        const std::int64_t batch = qkv.size(0), seq = qkv.size(1), embd = qkv.size(2) / 3;
        // [B, T, 3C] -> three [B, H, T, C/H]
        std::vector<at::Tensor> heads =
            qkv.view({batch, seq, 3, n_head_, embd / n_head_}).permute({2, 0, 3, 1, 4}).unbind(0);
        y = at::scaled_dot_product_attention(heads[0], heads[1], heads[2], mask, attn_dropout, /*is_causal=*/false)
                .transpose(1, 2)
                .contiguous()
                .view({batch, seq, embd});
      } else {
        // Causal: tessera::causal_self_attention picks the kernel (its own on a CPU).
        y = causal_self_attention(qkv, n_head_, attn_dropout);
      }
    }
    return row_parallel_output(tp_, *out_, y, dropout_, is_training());
  }

  std::shared_ptr<Affine>& out_proj() { return out_; }
  std::shared_ptr<Affine>& qkv_proj() { return qkv_; }

 private:
  std::int64_t n_head_;  // this rank's
  double dropout_;
  TensorParallel tp_;
  ContextParallel cp_;
  std::shared_ptr<Affine> qkv_, out_;
};

class Mlp : public torch::nn::Module {
 public:
  // `approximate`: "none" for the exact GELU, "tanh" for GPT-2's (Hugging Face's gelu_new).
  Mlp(std::int64_t n_embd, bool bias, double dropout, std::string approximate = "none", TensorParallel tp = {})
      : dropout_(dropout),
        approximate_(std::move(approximate)),
        tp_(std::move(tp)),
        up_(register_module("c_fc", linear_layer(n_embd, tp_.local(4 * n_embd), bias))),
        down_(register_module("c_proj", linear_layer(tp_.local(4 * n_embd), n_embd, bias))) {}

  // gelu(c_fc(x)) through tessera::linear_gelu, which picks the kernel (its own on a CPU); an
  // adapted c_fc through its forward(), which adds the adapters' terms.
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor hidden = up_->adapted() ? at::gelu(up_->forward(tp_.column_input(x)), approximate_)
                                             : linear_gelu(tp_.column_input(x), up_->weight, up_->bias, approximate_);
    return row_parallel_output(tp_, *down_, hidden, dropout_, is_training());
  }

  std::shared_ptr<Affine>& up_proj() { return up_; }
  std::shared_ptr<Affine>& down_proj() { return down_; }

 private:
  double dropout_;
  std::string approximate_;
  TensorParallel tp_;
  std::shared_ptr<Affine> up_, down_;
};

// Sequences that sequence and context parallelism split must have a length that is a multiple
// of this: 2 x cp chunks, each over the tensor-parallel ranks under sequence parallelism.
inline std::int64_t sequence_multiple(const TensorParallel& tp, const ContextParallel& cp) {
  return (cp.size() > 1 ? 2 * cp.size() : 1) * (tp.sequence_parallel() ? tp.size() : 1);
}

// Logits of every position for input_ids of any length (sampling grows a prompt one token at a
// time): the ids are padded at the end to the multiple the parallelism needs (causal attention:
// the padding changes no earlier position) and the padding's logits dropped. `logits_of` maps
// ids of a splittable length to their whole logits. Packed documents need splittable lengths.
inline at::Tensor logits_of_any_length(const at::Tensor& input_ids, std::int64_t multiple, bool documents,
                                       const std::function<at::Tensor(const at::Tensor&)>& logits_of) {
  if (input_ids.dim() != 2) return logits_of(input_ids);  // the model says what is wrong with it
  const std::int64_t seq = input_ids.size(1), padded = (seq + multiple - 1) / multiple * multiple;
  if (padded == seq) return logits_of(input_ids);
  if (documents) {
    throw Error("packed documents of " + std::to_string(seq) + " positions: sequence or context parallelism needs a "
                "multiple of " + std::to_string(multiple));
  }
  const at::Tensor tail = input_ids.narrow(1, seq - 1, 1).expand({input_ids.size(0), padded - seq});
  return logits_of(at::cat({input_ids, tail}, 1)).narrow(1, 0, seq);
}

// The splits of a CausalSelfAttention at `prefix` ("h.0.attn."): q, k and v heads in c_attn's
// three blocks, c_proj's input units.
inline void attention_plan(TensorParallelPlan& plan, const std::string& prefix, bool bias) {
  plan[prefix + "c_attn.weight"] = TensorShard::columns(3);
  if (bias) plan[prefix + "c_attn.bias"] = TensorShard{0, 3};
  plan[prefix + "c_proj.weight"] = TensorShard::rows();
}

// The splits of an Mlp at `prefix` ("h.0.mlp."): c_fc's hidden units, c_proj's input units.
inline void mlp_plan(TensorParallelPlan& plan, const std::string& prefix, bool bias) {
  plan[prefix + "c_fc.weight"] = TensorShard::columns();
  if (bias) plan[prefix + "c_fc.bias"] = TensorShard{0, 1};
  plan[prefix + "c_proj.weight"] = TensorShard::rows();
}

}  // namespace tessera::gpt_parts
