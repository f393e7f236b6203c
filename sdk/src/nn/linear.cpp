#include "tessera/nn/linear.hpp"

#include <ATen/ops/linear.h>

#include "tessera/nn/deferred_init.hpp"
#include "tessera/error.hpp"

namespace tessera {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias, bool adaptable)
    : in_features_(in_features), out_features_(out_features), adaptable_(adaptable) {
  weight = register_parameter("weight", new_parameter({out_features, in_features}));
  if (with_bias) {
    at::Tensor zero = new_parameter({out_features});
    if (!zero.is_meta()) zero.zero_();
    bias = register_parameter("bias", zero);
  }
}

namespace {
thread_local int adapters_off_depth = 0;
}  // namespace

AdaptersOff::AdaptersOff() { ++adapters_off_depth; }
AdaptersOff::~AdaptersOff() { --adapters_off_depth; }
bool AdaptersOff::active() { return adapters_off_depth > 0; }

at::Tensor Linear::forward(const at::Tensor& x) const {
  at::Tensor y = at::linear(x, weight, bias);
  if (AdaptersOff::active()) return y;
  for (const Term& term : terms_) y = y + term(x);
  return y;
}

void Linear::add_term(Term term) {
  if (!adaptable_) throw Error("this linear layer is not adaptable: the model reads its weight directly");
  terms_.push_back(std::move(term));
}

}  // namespace tessera
