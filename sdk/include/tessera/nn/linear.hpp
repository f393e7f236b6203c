// A model's linear layer, y = x·Wᵀ + b, that adapters can extend (tessera/components/adapter.hpp): an adapter
// adds a term computed from the same input (LoRA's scaled B·A·x), and every caller of forward()
// gets it. Models build their projections from this class so that any adapter plugin can reach
// them by their Hugging Face names (q_proj, c_attn, down_proj, ...) without the model knowing it.
//
// A layer whose weight the model also reads directly (an MoE router's scores) is built not
// adaptable: an adapter's term would be lost there, so adapters skip it (or refuse it by name).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

class TESSERA_API Linear : public torch::nn::Module {
 public:
  // What an adapter adds to the layer's output, given the layer's input.
  using Term = std::function<at::Tensor(const at::Tensor& x)>;

  // Parameters from tessera::new_parameter (the meta device while the host defers
  // initialisation); the weight uninitialised (the model writes it), the bias zero.
  Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias, bool adaptable = true);

  // x·Wᵀ + b, plus each adapter's term.
  at::Tensor forward(const at::Tensor& x) const;

  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }
  bool adaptable() const { return adaptable_; }
  // Whether some adapter added a term: callers that fuse the layer with what follows (a GELU
  // kernel reading the weight) go through forward() then.
  bool adapted() const { return !terms_.empty(); }
  // Throws for a layer built not adaptable. The term's parameters are registered by the adapter
  // (as submodules of this layer, so they are the model's parameters).
  void add_term(Term term);

  at::Tensor weight, bias;  // weight [out, in]; bias [out] or undefined

 private:
  std::int64_t in_features_, out_features_;
  bool adaptable_;
  std::vector<Term> terms_;
};

// While one lives on this thread, every Linear computes x·Wᵀ + b without its adapters' terms:
// the base model, as preference optimisation's reference (loss/dpo) reads it with no second copy.
class TESSERA_API AdaptersOff {
 public:
  AdaptersOff();
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;
  static bool active();
};

}  // namespace tessera
