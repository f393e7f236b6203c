// The parameters of a kit model (tessera/nn/): made without storage while the host defers
// initialisation, known by name, given their initial values by one rule of the model's, and
// counted whole whatever the ranks hold.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessera/nn/deferred_init.hpp"
#include "tessera/export.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera::nn {

// A parameter from tessera::new_parameter: on the meta device while the host defers
// initialisation (tessera/nn/deferred_init.hpp), else on the CPU filled with `fill` (norms' ones,
// biases' zeros) until the model's initialisation writes it.
TESSERA_API at::Tensor parameter(at::IntArrayRef sizes, double fill);

inline bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// The name of each of a model's parameters by identity: initialize_parameters gets tensors
// (possibly materialised from the meta device, the same TensorImpl), not names.
class TESSERA_API ParameterNames {
 public:
  explicit ParameterNames(const torch::nn::Module& model);
  // Throws naming `model_kind` ("model/gpt") when `p` is not one of the model's parameters.
  const std::string& of(const at::Tensor& p, const std::string& model_kind) const;

 private:
  std::map<const c10::TensorImpl*, std::string> names_;
};

// How one parameter starts: a constant, or normal(0, std).
struct InitialValue {
  bool normal = false;
  double value = 0.0;  // the constant, or the standard deviation

  static InitialValue constant(double v) { return {false, v}; }
  static InitialValue normal_with_std(double std) { return {true, std}; }
};
// A model's initialisation as one rule: a parameter's name to how it starts.
using InitRule = std::function<InitialValue(const std::string& name)>;

// Writes `params` of `model` as `rule` says. A random tensor's values come from its own generator
// (`init_seed` and its name), drawn on the CPU for the whole parameter and cut to this rank's
// part (`plan`; tensor- or expert-parallel ranks): the same values whatever subset is
// initialised, in whatever order, on whatever device (fsdp initialises its shards unit by unit),
// whatever the ranks.
TESSERA_API void initialize_parameters(const torch::nn::Module& model, const std::string& model_kind,
                                       const std::vector<at::Tensor>& params, std::uint64_t init_seed,
                                       const InitRule& rule, const TensorParallelPlan& plan = {},
                                       const TensorParallel& tp = {}, const ExpertParallel& ep = {});

}  // namespace tessera::nn
