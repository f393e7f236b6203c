// Kind `model`: a LibTorch module that maps token ids to next-token logits, and says how much
// compute a token costs so the host can report MFU.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

#include "tessera/export.hpp"

namespace tessera {

class TESSERA_API Model : public torch::nn::Module {
 public:
  static constexpr const char* kKind = "model";
  ~Model() override;

  // input_ids [batch, seq] int64 -> logits [batch, seq, vocab_size()].
  virtual at::Tensor forward(const at::Tensor& input_ids) = 0;
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int64_t max_seq_len() const = 0;
  // Training FLOPs (forward + backward) per token at this sequence length.
  virtual double flops_per_token(std::int64_t seq_len) const = 0;
  // Number of trainable parameter elements.
  std::int64_t num_parameters() const;
};

}  // namespace tessera
