// Mixed precision. Under settings.precision: bf16 the parameters, gradients and optimizer state
// stay float32 (master weights) and LibTorch's autocast runs the forward pass (and with it the
// backward) in bfloat16; ops autocast keeps in float32 (softmax, log-softmax, norms, losses)
// stay there. Anything that runs the model outside the trainer's step (an evaluation, sampling)
// opens the same guard so it computes as training does.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

#include "tessera/export.hpp"

namespace tessera {

// "fp32" -> Float, "bf16" -> BFloat16; anything else is an Error naming the accepted values.
TESSERA_API at::ScalarType compute_dtype(const std::string& precision);

// Whether LibTorch has fast bfloat16 matrix products on this CPU: oneDNN's, which need AVX-512
// (BW, VL and DQ) on x86. Without them LibTorch multiplies bfloat16 matrices in a generic loop,
// about twenty times slower than float32 (the quickstart's step: 2.6 s against 0.13 s on an
// AVX2-only AMD EPYC): bf16 on such a CPU is for checking numerics, not for speed.
TESSERA_API bool cpu_has_fast_bf16_matmul();

// While alive, autocast computes in `dtype` on `device`'s type; float32 leaves autocast as it
// was. Nests: the state before is restored at the end of the scope.
class TESSERA_API AutocastGuard {
 public:
  AutocastGuard(const c10::Device& device, at::ScalarType dtype);
  AutocastGuard(const c10::Device& device, const std::string& precision)
      : AutocastGuard(device, compute_dtype(precision)) {}
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType type_;
  bool active_ = false;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

// While alive, autocast is off on `device`'s type: for computations that choose their dtypes
// themselves (a chunked loss, an MoE router kept in float32). The state before comes back after.
class TESSERA_API NoAutocast {
 public:
  explicit NoAutocast(const c10::Device& device);
  ~NoAutocast();
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  c10::DeviceType type_;
  bool was_enabled_;
};

}  // namespace tessera
