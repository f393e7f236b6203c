// Kind `loss`: returns the summed loss and the number of target tokens, never a mean, so the
// trainer can normalise by the global token count across micro-batches and ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include "tessera/export.hpp"

namespace tessera {

struct LossSum {
  at::Tensor sum;    // scalar, float32
  at::Tensor count;  // scalar, int64: targets that contributed
};

class TESSERA_API Loss {
 public:
  static constexpr const char* kKind = "loss";
  virtual ~Loss();
  // logits [batch, seq, vocab], labels [batch, seq] with kIgnoreIndex where no loss is taken.
  virtual LossSum compute(const at::Tensor& logits, const at::Tensor& labels) = 0;
};

}  // namespace tessera
