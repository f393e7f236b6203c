#include "tessera/nn/mlp.hpp"

#include <ATen/ops/gelu.h>
#include <ATen/ops/silu.h>

#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/kernels/linear_gelu.hpp"
#include "tessera/nn/attention.hpp"

namespace tessera::nn {

GeluMlp::GeluMlp(std::int64_t n_embd, std::int64_t hidden, bool bias, double dropout, std::string approximate,
                 TensorParallel tp)
    : dropout_(dropout),
      approximate_(std::move(approximate)),
      tp_(std::move(tp)),
      up_(register_module("c_fc", std::make_shared<Linear>(n_embd, tp_.local(hidden), bias))),
      down_(register_module("c_proj", std::make_shared<Linear>(tp_.local(hidden), n_embd, bias))) {}

at::Tensor GeluMlp::forward(const at::Tensor& x) {
  // An adapted c_fc goes through its forward(), which adds the adapters' terms.
  const at::Tensor hidden = up_->adapted() ? at::gelu(up_->forward(tp_.column_input(x)), approximate_)
                                           : linear_gelu(tp_.column_input(x), up_->weight, up_->bias, approximate_);
  return row_parallel_output(tp_, *down_, hidden, dropout_, is_training());
}

void GeluMlp::plan(TensorParallelPlan& plan, const std::string& prefix, bool bias) {
  plan[prefix + "c_fc.weight"] = TensorShard::columns();
  if (bias) plan[prefix + "c_fc.bias"] = TensorShard{0, 1};
  plan[prefix + "c_proj.weight"] = TensorShard::rows();
}

SwiGlu::SwiGlu(std::int64_t hidden, std::int64_t intermediate, bool bias, TensorParallel tp,
               const std::string& activation)
    : tp_(std::move(tp)),
      gelu_(activation == "gelu_tanh"),
      gate_(register_module("gate_proj", std::make_shared<Linear>(hidden, tp_.local(intermediate), bias))),
      up_(register_module("up_proj", std::make_shared<Linear>(hidden, tp_.local(intermediate), bias))),
      down_(register_module("down_proj", std::make_shared<Linear>(tp_.local(intermediate), hidden, bias))) {
  if (!gelu_ && activation != "silu") throw Error("SwiGlu: activation '" + activation + "' is not silu or gelu_tanh");
}

at::Tensor SwiGlu::forward(const at::Tensor& input) {
  const at::Tensor x = tp_.column_input(input);
  const at::Tensor gate = gate_->forward(x);  // before up_proj: an adapter's dropout draws in this order
  return gated_output(gate, up_->forward(x));
}

at::Tensor SwiGlu::forward_cached(const at::Tensor& input, KvCache& cache, std::size_t layer) {
  const std::vector<at::Tensor> projected =
      side_by_side({gate_.get(), up_.get()}, tp_.column_input(input), cache, layer, "gate_up_proj");
  return gated_output(projected[0], projected[1]);
}

at::Tensor SwiGlu::gated_output(const at::Tensor& gate, const at::Tensor& up) const {
  const at::Tensor activated = gelu_ ? at::gelu(gate, "tanh") : at::silu(gate);
  return row_parallel_output(tp_, *down_, activated * up, 0.0, is_training());
}

void SwiGlu::plan(TensorParallelPlan& plan, const std::string& prefix, bool bias) {
  for (const char* column : {"gate_proj", "up_proj"}) {
    plan[prefix + column + ".weight"] = TensorShard::columns();
    if (bias) plan[prefix + column + ".bias"] = TensorShard{0, 1};
  }
  plan[prefix + "down_proj.weight"] = TensorShard::rows();
}

}  // namespace tessera::nn
