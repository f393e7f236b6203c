// The GPT-2 pieces model/gpt and model/gpt_moe share: a layer norm with an optional bias, causal
// self-attention and the dense 4x GELU MLP. Parameter names follow GPT-2 (c_attn, c_proj, c_fc),
// so exports and checkpoints of both models read the same way. Header-only: each model plugin
// compiles its own copy (plugins share no code at run time).
#pragma once

#include <ATen/ops/dropout.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/attention.hpp"
#include "tessera/linear_gelu.hpp"
#include "tessera/deferred_init.hpp"
#include "tessera/error.hpp"

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

// GPT-2 init, parameter by parameter, for `params` of `model` (named `model_kind` in errors):
// normal(0, init_std) weights and embeddings, residual output projections (every "c_proj.weight":
// attention, MLP, experts) normal(0, residual_std) to keep the residual stream's variance flat,
// ones and zeros for norms and biases. Each tensor's values come from its own generator (the
// model's init seed and its name), drawn on the CPU: the same values whatever subset is
// initialised, in whatever order, on whatever device (fsdp initialises its shards unit by unit).
inline void initialize_gpt2_parameters(const torch::nn::Module& model, const char* model_kind,
                                       const std::vector<at::Tensor>& params, std::uint64_t init_seed,
                                       double init_std, double residual_std) {
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
      at::Tensor values = at::empty(p.sizes(), at::kFloat);
      values.normal_(0.0, ends_with("c_proj.weight") ? residual_std : init_std, init_generator(init_seed, name));
      p.copy_(values);
    }
  }
}

// y = x·Wᵀ + b: torch::nn::Linear without allocating at construction (its reset() would).
class Affine : public torch::nn::Module {
 public:
  Affine(std::int64_t in, std::int64_t out, bool with_bias) {
    weight = register_parameter("weight", new_parameter({out, in}));
    if (with_bias) bias = register_parameter("bias", parameter({out}, 0.0));
  }
  at::Tensor forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }

  at::Tensor weight, bias;  // bias undefined without one
};

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

// torch::nn::LayerNorm has no bias switch, so this one holds its own affine parameters.
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(std::int64_t dim, bool bias) : dim_(dim) {
    weight_ = register_parameter("weight", parameter({dim}, 1.0));
    if (bias) bias_ = register_parameter("bias", parameter({dim}, 0.0));
  }
  at::Tensor forward(const at::Tensor& x) { return at::layer_norm(x, {dim_}, weight_, bias_); }

 private:
  std::int64_t dim_;
  at::Tensor weight_, bias_;  // bias_ stays undefined when bias is off
};

class CausalSelfAttention : public torch::nn::Module {
 public:
  CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, bool bias, double dropout)
      : n_head_(n_head),
        dropout_(dropout),
        qkv_(register_module("c_attn", linear_layer(n_embd, 3 * n_embd, bias))),
        out_(register_module("c_proj", linear_layer(n_embd, n_embd, bias))) {}

  // `mask` (optional, [batch, 1, seq, seq] bool): which keys each query may see; causal without.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask = {}) {
    const double attn_dropout = is_training() ? dropout_ : 0.0;
    at::Tensor y;
    if (mask.defined()) {
      const std::int64_t batch = x.size(0), seq = x.size(1), embd = x.size(2);
      // [B, T, 3C] -> three [B, H, T, C/H]
      std::vector<at::Tensor> qkv = qkv_->forward(x)
                                        .view({batch, seq, 3, n_head_, embd / n_head_})
                                        .permute({2, 0, 3, 1, 4})
                                        .unbind(0);
      y = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], mask, attn_dropout, /*is_causal=*/false)
              .transpose(1, 2)
              .contiguous()
              .view({batch, seq, embd});
    } else {
      // Causal: tessera::causal_self_attention picks the kernel (its own on a CPU).
      y = causal_self_attention(qkv_->forward(x), n_head_, attn_dropout);
    }
    return at::dropout(out_->forward(y), dropout_, is_training());
  }

  std::shared_ptr<Affine>& out_proj() { return out_; }
  std::shared_ptr<Affine>& qkv_proj() { return qkv_; }

 private:
  std::int64_t n_head_;
  double dropout_;
  std::shared_ptr<Affine> qkv_, out_;
};

class Mlp : public torch::nn::Module {
 public:
  // `approximate`: "none" for the exact GELU, "tanh" for GPT-2's (Hugging Face's gelu_new).
  Mlp(std::int64_t n_embd, bool bias, double dropout, std::string approximate = "none")
      : dropout_(dropout),
        approximate_(std::move(approximate)),
        up_(register_module("c_fc", linear_layer(n_embd, 4 * n_embd, bias))),
        down_(register_module("c_proj", linear_layer(4 * n_embd, n_embd, bias))) {}

  // gelu(c_fc(x)) through tessera::linear_gelu, which picks the kernel (its own on a CPU).
  at::Tensor forward(const at::Tensor& x) {
    return at::dropout(down_->forward(linear_gelu(x, up_->weight, up_->bias, approximate_)), dropout_, is_training());
  }

  std::shared_ptr<Affine>& up_proj() { return up_; }
  std::shared_ptr<Affine>& down_proj() { return down_; }

 private:
  double dropout_;
  std::string approximate_;
  std::shared_ptr<Affine> up_, down_;
};

}  // namespace tessera::gpt_parts
