// Log-probabilities of a rollout's completion tokens (tessera/components/rollout.hpp).
#include "tessera/components/rollout.hpp"

#include <ATen/ops/log_softmax.h>

#include "tessera/run/batch.hpp"

namespace tessera {

at::Tensor tempered_log_probs(const at::Tensor& logits, double temperature) {
  at::Tensor scaled = logits.to(at::kFloat);
  if (temperature > 0 && temperature != 1.0) scaled = scaled / temperature;
  return at::log_softmax(scaled, -1);
}

at::Tensor label_logps(const at::Tensor& log_probs, const at::Tensor& labels) {
  const at::Tensor mask = labels.ne(kIgnoreIndex);
  const at::Tensor safe = labels.masked_fill(mask.logical_not(), 0);
  return log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1).masked_fill(mask.logical_not(), 0);
}

at::Tensor completion_logps(const at::Tensor& logits, const at::Tensor& labels, double temperature) {
  return label_logps(tempered_log_probs(logits, temperature), labels);
}

}  // namespace tessera
