#include "tessera/nn/rotary.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/where.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "tessera/error.hpp"

namespace tessera::nn {

double YarnScaling::mscale_of(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

double YarnScaling::cos_sin_factor() const {
  if (attention_factor) return *attention_factor;
  if (mscale && mscale_all_dim && *mscale != 0.0 && *mscale_all_dim != 0.0) {
    return mscale_of(factor, *mscale) / mscale_of(factor, *mscale_all_dim);
  }
  return mscale_of(factor);
}

namespace {

// The inverse frequencies of YaRN for a head of `d` dimensions (in float32 as transformers
// computes them, so that the tables agree to the last bit).
at::Tensor yarn_frequencies(const YarnScaling& y, std::int64_t d, double theta) {
  const at::Tensor wavelengths = at::pow(theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d));
  // The dimension at which a frequency turns `rotations` times over the original context.
  const auto dimension_of = [&](double rotations) {
    return static_cast<double>(d) * std::log(static_cast<double>(y.original_max_positions) / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  double low = dimension_of(y.beta_fast), high = dimension_of(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;  // no empty ramp
  const at::Tensor ramp = ((at::arange(d / 2, at::kLong).to(at::kFloat) - low) / (high - low)).clamp(0, 1);
  const at::Tensor kept = 1 - ramp;  // 1: extrapolated (the original frequency), 0: interpolated
  return 1.0 / (y.factor * wavelengths) * (1 - kept) + 1.0 / wavelengths * kept;
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const RotarySpec& spec) {
  c10::NoGradGuard no_grad;
  const std::int64_t d = spec.head_dim;
  at::Tensor inv_freq =
      1.0 / at::pow(spec.theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d));
  if (spec.llama3_scaling && spec.yarn) throw Error("RotaryEmbedding: llama3 scaling and YaRN together");
  double scale = 1.0;
  if (spec.yarn) {
    if (spec.yarn->factor <= 0 || spec.yarn->original_max_positions < 1) {
      throw Error("RotaryEmbedding: YaRN needs factor > 0 and original_max_positions >= 1");
    }
    inv_freq = yarn_frequencies(*spec.yarn, d, spec.theta);
    scale = spec.yarn->cos_sin_factor();
  }
  if (spec.llama3_scaling) {
    const std::vector<double>& s = *spec.llama3_scaling;
    const double factor = s[0], low = s[1], high = s[2], original = s[3];
    const double low_wavelen = original / low, high_wavelen = original / high;
    const at::Tensor wavelen = 2.0 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
    const at::Tensor smooth = (original / wavelen - low) / (high - low);
    const at::Tensor blended = (1 - smooth) * scaled / factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = at::where(medium, blended, scaled);
  }
  if (spec.linear_factor != 1.0) inv_freq = inv_freq / spec.linear_factor;
  const at::Tensor freqs = at::outer(at::arange(spec.max_positions, at::kLong).to(at::kFloat), inv_freq);
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  cos_ = at::cos(angles);
  sin_ = at::sin(angles);
  if (scale != 1.0) {
    cos_ = cos_ * scale;
    sin_ = sin_ * scale;
  }
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::tables(std::int64_t seq, const at::Tensor& positions,
                                                          at::ScalarType dtype, const at::Device& device) {
  if (!cos_on_.defined() || cos_on_.device() != device || cos_on_.scalar_type() != dtype) {
    cos_on_ = cos_.to(device, dtype);
    sin_on_ = sin_.to(device, dtype);
  }
  if (!positions.defined()) return {cos_on_.narrow(0, 0, seq), sin_on_.narrow(0, 0, seq)};
  const at::Tensor flat = positions.flatten();
  return {cos_on_.index_select(0, flat).view({positions.size(0), 1, positions.size(1), -1}),
          sin_on_.index_select(0, flat).view({positions.size(0), 1, positions.size(1), -1})};
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::tables_for(std::int64_t seq, const at::Tensor& positions,
                                                              const at::Tensor& stream) {
  const c10::DeviceType device = stream.device().type();
  const at::ScalarType dtype =
      at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : stream.scalar_type();
  return tables(seq, positions, dtype, stream.device());
}

at::Tensor RotaryEmbedding::apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace tessera::nn
