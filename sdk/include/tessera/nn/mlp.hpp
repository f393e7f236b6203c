// The feed-forward layers of a transformer block, tensor-parallel by hidden units (the input
// projections column-parallel, the output projection row-parallel):
//   GeluMlp  c_fc -> GELU -> c_proj (GPT-2), the GELU fused with c_fc where no adapter extends it
//   SwiGlu   down_proj(act(gate_proj(x)) * up_proj(x)): act silu (SwiGLU: Llama, Mistral, Qwen,
//            DeepSeek) or the tanh GELU (GeGLU: Gemma)
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/export.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/layer.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera::nn {

class TESSERA_API GeluMlp : public FeedForward {
 public:
  // `approximate`: "none" for the exact GELU, "tanh" for GPT-2's (Hugging Face's gelu_new).
  // `dropout`: of the output, the residual branch's.
  GeluMlp(std::int64_t n_embd, std::int64_t hidden, bool bias, double dropout, std::string approximate = "none",
          TensorParallel tp = {});
  at::Tensor forward(const at::Tensor& x) override;
  // Its splits at `prefix` ("h.0.mlp."): c_fc's hidden units, c_proj's input units.
  static void plan(TensorParallelPlan& plan, const std::string& prefix, bool bias);

 private:
  double dropout_;
  std::string approximate_;
  TensorParallel tp_;
  std::shared_ptr<Linear> up_, down_;
};

class TESSERA_API SwiGlu : public FeedForward {
 public:
  // `activation`: "silu" or "gelu_tanh".
  SwiGlu(std::int64_t hidden, std::int64_t intermediate, bool bias = false, TensorParallel tp = {},
         const std::string& activation = "silu");
  at::Tensor forward(const at::Tensor& x) override;
  // gate_proj and up_proj as one product (side_by_side).
  at::Tensor forward_cached(const at::Tensor& x, KvCache& cache, std::size_t layer) override;
  // Its splits at `prefix` ("layers.0.mlp."): gate_proj's and up_proj's units, down_proj's inputs.
  static void plan(TensorParallelPlan& plan, const std::string& prefix, bool bias = false);

 private:
  // down_proj(act(gate) · up).
  at::Tensor gated_output(const at::Tensor& gate, const at::Tensor& up) const;

  TensorParallel tp_;
  bool gelu_;
  std::shared_ptr<Linear> gate_, up_, down_;
};

}  // namespace tessera::nn
