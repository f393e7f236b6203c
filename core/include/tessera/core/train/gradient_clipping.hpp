// Clipping by the global gradient norm, as the trainer applies it between the norm's reduction
// over ranks and the optimizer step.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace tessera::core {

// Scales every gradient in place by min(1, max_norm / (total_norm + 1e-6)), computed on the
// device from `total_norm` (a float32 scalar tensor there): no host synchronisation. One
// multi-tensor multiply per gradient dtype, the coefficient cast to that dtype (LibTorch's fused
// path wants them alike), so a float32 gradient is never scaled by a coefficient rounded to the
// bf16 of another parameter.
void clip_gradients_by_norm(const std::vector<at::Tensor>& grads, const at::Tensor& total_norm, double max_norm);

}  // namespace tessera::core
