// Rotary position embeddings (RoPE) in Hugging Face's rotate-half layout: the angle of position p
// and frequency i is p / theta^(2i / d), each frequency used for both halves of a head. Variants:
// the plain one, Llama 3's frequency-dependent scaling and YaRN (Qwen's and DeepSeek-V3's long
// context). The tables are derived from the config, never weights: neither a checkpoint nor an
// import carries them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "tessera/export.hpp"

namespace tessera::nn {

// YaRN (Peng et al. 2023, as Hugging Face's rope_type "yarn"): frequencies that turn fewer than
// beta_slow times over original_max_positions interpolated by `factor`, those that turn more
// than beta_fast times kept, a linear ramp between; cos and sin scaled by the attention factor
// (given, or 0.1·ln(factor)+1, or DeepSeek's ratio of that with mscale over mscale_all_dim).
struct TESSERA_API YarnScaling {
  double factor = 1.0;
  std::int64_t original_max_positions = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> attention_factor;
  std::optional<double> mscale, mscale_all_dim;
  bool truncate = true;  // the ramp's ends rounded outwards to whole dimensions

  // The factor cos and sin are multiplied by.
  double cos_sin_factor() const;
  // yarn_get_mscale: 0.1·m·ln(scale)+1 (1 for scale <= 1), also DeepSeek-V3's softmax scale.
  static double mscale_of(double scale, double m = 1.0);
};

struct RotarySpec {
  std::int64_t head_dim = 0;       // the rotated size of a head (even)
  std::int64_t max_positions = 0;  // the tables' length
  double theta = 10000.0;
  // Llama 3's scaling [factor, low_freq_factor, high_freq_factor, original_max_positions]:
  // long wavelengths slowed by factor, short ones kept, the band between interpolated.
  std::optional<std::vector<double>> llama3_scaling;
  std::optional<YarnScaling> yarn;  // at most one of the two scalings
  // Linear scaling (Hugging Face's rope_type "linear", Gemma 3's global layers): positions
  // divided by it, i.e. every frequency. 1: none.
  double linear_factor = 1.0;
};

class TESSERA_API RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  explicit RotaryEmbedding(const RotarySpec& spec);

  // cos and sin for a forward pass, in `dtype` on `device` (copied there once, not every pass):
  // [seq, head_dim] for positions 0 .. seq-1 when `positions` is undefined, else [batch, 1, T,
  // head_dim] at `positions` [batch, T] (packed documents restart them; context parallelism
  // gives a rank its slice's global positions).
  std::pair<at::Tensor, at::Tensor> tables(std::int64_t seq, const at::Tensor& positions, at::ScalarType dtype,
                                           const at::Device& device);
  // The same in the compute dtype of a forward pass whose residual stream is `stream` (as Hugging
  // Face casts them): the autocast dtype under autocast, where the projections the tables
  // multiply come out in it, else the stream's.
  std::pair<at::Tensor, at::Tensor> tables_for(std::int64_t seq, const at::Tensor& positions, const at::Tensor& stream);

  // x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1] along the last dimension.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

 private:
  at::Tensor cos_, sin_;        // float32 on the CPU, [max_positions, head_dim]
  at::Tensor cos_on_, sin_on_;  // the same on the device and in the dtype of the last pass
};

}  // namespace tessera::nn
