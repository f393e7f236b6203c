#include "tessera/core/train/gradient_clipping.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_foreach_mul.h>

#include <utility>

namespace tessera::core {

void clip_gradients_by_norm(const std::vector<at::Tensor>& grads, const at::Tensor& total_norm, double max_norm) {
  if (grads.empty()) return;
  const at::Tensor coef = (max_norm / (total_norm + 1e-6)).clamp_max(1.0);
  // Grouped in first-seen order; almost always a single group (float32 master gradients).
  std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> by_dtype;
  for (const at::Tensor& g : grads) {
    auto it = by_dtype.begin();
    while (it != by_dtype.end() && it->first != g.scalar_type()) ++it;
    if (it == by_dtype.end()) it = by_dtype.insert(by_dtype.end(), {g.scalar_type(), {}});
    it->second.push_back(g);
  }
  for (auto& [dtype, group] : by_dtype) at::_foreach_mul_(group, coef.to(dtype));
}

}  // namespace tessera::core
