// The GPT-2 pieces model/gpt and model/gpt_moe share: a layer norm with an optional bias, causal
// self-attention and the dense 4x GELU MLP. Parameter names follow GPT-2 (c_attn, c_proj, c_fc),
// so exports and checkpoints of both models read the same way. Header-only: each model plugin
// compiles its own copy (plugins share no code at run time).
#pragma once

#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

namespace tessera::gpt_parts {

inline torch::nn::Linear linear_layer(std::int64_t in, std::int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// GPT-2 init of an affine map: normal weights, zero bias (when there is one).
inline void init_affine(at::Tensor& weight, at::Tensor& bias, double std_dev) {
  weight.normal_(0.0, std_dev);
  if (bias.defined()) bias.zero_();
}

// torch::nn::LayerNorm has no bias switch, so this one holds its own affine parameters.
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(std::int64_t dim, bool bias) : dim_(dim) {
    weight_ = register_parameter("weight", at::ones({dim}));
    if (bias) bias_ = register_parameter("bias", at::zeros({dim}));
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

  at::Tensor forward(const at::Tensor& x) {
    const std::int64_t batch = x.size(0), seq = x.size(1), embd = x.size(2);
    // [B, T, 3C] -> three [B, H, T, C/H]
    std::vector<at::Tensor> qkv = qkv_->forward(x)
                                      .view({batch, seq, 3, n_head_, embd / n_head_})
                                      .permute({2, 0, 3, 1, 4})
                                      .unbind(0);
    const double attn_dropout = is_training() ? dropout_ : 0.0;
    at::Tensor y = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], /*attn_mask=*/{},
                                                    attn_dropout, /*is_causal=*/true);
    y = y.transpose(1, 2).contiguous().view({batch, seq, embd});
    return at::dropout(out_->forward(y), dropout_, is_training());
  }

  torch::nn::Linear& out_proj() { return out_; }
  torch::nn::Linear& qkv_proj() { return qkv_; }

 private:
  std::int64_t n_head_;
  double dropout_;
  torch::nn::Linear qkv_, out_;
};

class Mlp : public torch::nn::Module {
 public:
  Mlp(std::int64_t n_embd, bool bias, double dropout)
      : dropout_(dropout),
        up_(register_module("c_fc", linear_layer(n_embd, 4 * n_embd, bias))),
        down_(register_module("c_proj", linear_layer(4 * n_embd, n_embd, bias))) {}

  at::Tensor forward(const at::Tensor& x) {
    return at::dropout(down_->forward(at::gelu(up_->forward(x))), dropout_, is_training());
  }

  torch::nn::Linear& up_proj() { return up_; }
  torch::nn::Linear& down_proj() { return down_; }

 private:
  double dropout_;
  torch::nn::Linear up_, down_;
};

}  // namespace tessera::gpt_parts
