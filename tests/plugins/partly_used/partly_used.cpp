// model/partly_used: a small real model whose detour layer takes part in some forwards only, for
// the tests of parameters that get no gradient in a step (the data-parallel strategies):
//
//   logits = h · head_weightᵀ,  h = embed[ids]  (+ tanh(h · detour_weightᵀ + detour_bias) when taken)
//
// detour: always, never, or even (taken when the batch's first token is even, so ranks and steps
// differ in whether they reach it).
#include <ATen/ops/embedding.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/config/config_fields.hpp"
#include "tessera/components/model.hpp"
#include "tessera/plugin.hpp"

namespace {

struct PartlyUsedConfig {
  std::int64_t vocab_size = 32;
  std::int64_t width = 16;
  std::int64_t max_seq_len = 16;
  std::string detour = "even";

  static void declare(tessera::ConfigFields<PartlyUsedConfig>& f) {
    using C = PartlyUsedConfig;
    f.field("vocab_size", &C::vocab_size, "tokens").at_least(2);
    f.field("width", &C::width, "hidden width").at_least(1);
    f.field("max_seq_len", &C::max_seq_len, "longest sequence").at_least(1);
    f.field("detour", &C::detour, "when the detour layer is used").one_of({"always", "never", "even"});
  }
};

class PartlyUsed final : public tessera::Model {
 public:
  explicit PartlyUsed(PartlyUsedConfig c) : c_(std::move(c)) {
    embed_ = register_parameter("embed", at::randn({c_.vocab_size, c_.width}) * 0.5);
    detour_weight_ = register_parameter("detour_weight", at::randn({c_.width, c_.width}) * 0.3);
    detour_bias_ = register_parameter("detour_bias", at::randn({c_.width}) * 0.1);
    head_weight_ = register_parameter("head_weight", at::randn({c_.vocab_size, c_.width}) * 0.3);
  }

  std::int64_t vocab_size() const override { return c_.vocab_size; }
  std::int64_t max_seq_len() const override { return c_.max_seq_len; }
  double flops_per_token(std::int64_t) const override { return 6.0 * static_cast<double>(num_parameters()); }

 protected:
  at::Tensor compute(const at::Tensor& input_ids) override {
    at::Tensor h = at::embedding(embed_, input_ids);
    if (takes_detour(input_ids)) h = h + at::tanh(at::linear(h, detour_weight_, detour_bias_));
    return at::linear(h, head_weight_);
  }

 private:
  bool takes_detour(const at::Tensor& input_ids) const {
    if (c_.detour == "always") return true;
    if (c_.detour == "never") return false;
    return input_ids.flatten()[0].item<std::int64_t>() % 2 == 0;  // a host read: CPU tests only
  }

  PartlyUsedConfig c_;
  at::Tensor embed_, detour_weight_, detour_bias_, head_weight_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, PartlyUsedConfig>(
      "partly_used", "test model: embedding, a detour layer used by some forwards only, output head",
      [](const PartlyUsedConfig& c) { return std::make_shared<PartlyUsed>(c); });
}

}  // namespace

TESSERA_PLUGIN("test_partly_used", "0.1.0", register_components)
