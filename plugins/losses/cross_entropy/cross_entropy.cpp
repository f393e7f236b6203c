// Loss `cross_entropy`: summed next-token cross-entropy and the number of target tokens, so the
// trainer can normalise by the global token count. Runs entirely on the device (no host sync).
// With chunk_size > 0 it takes the model's hidden states and output head and computes logits a
// chunk of tokens at a time (chunked_linear_cross_entropy.hpp).
#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cross_entropy_loss.h>

#include <algorithm>
#include <memory>

#include "chunked_linear_cross_entropy.hpp"
#include "tessera/run/batch.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/plugin.hpp"

namespace {

struct CrossEntropyConfig {
  double label_smoothing = 0.0;
  std::int64_t chunk_size = 0;

  static void declare(tessera::ConfigFields<CrossEntropyConfig>& f) {
    f.field("label_smoothing", &CrossEntropyConfig::label_smoothing, "mass spread uniformly over the vocabulary")
        .at_least(0)
        .less_than(1);
    f.field("chunk_size", &CrossEntropyConfig::chunk_size,
            "tokens whose logits exist at once (0: all); > 0 needs a model with an output head (gpt, gpt_moe) and "
            "never holds the whole [tokens, vocab] logits")
        .at_least(0);
  }
};

class CrossEntropyLoss final : public tessera::Loss {
 public:
  explicit CrossEntropyLoss(const CrossEntropyConfig& config)
      : label_smoothing_(config.label_smoothing), chunk_size_(config.chunk_size) {}

  tessera::LossSum compute(const at::Tensor& logits, const at::Tensor& labels) override {
    const std::int64_t vocab = logits.size(-1);
    // Upcast so the log-softmax over a large vocabulary is accurate under bf16/fp16 logits.
    const at::Tensor flat_logits = logits.reshape({-1, vocab}).to(at::kFloat);
    const at::Tensor flat_labels = labels.reshape({-1});
    at::Tensor sum =
        at::cross_entropy_loss(flat_logits, flat_labels, /*weight=*/{}, at::Reduction::Sum,
                               tessera::kIgnoreIndex, label_smoothing_);
    at::Tensor count = flat_labels.ne(tessera::kIgnoreIndex).sum(at::kLong);
    return {std::move(sum), std::move(count)};
  }

  bool takes_hidden_states() const override { return chunk_size_ > 0; }
  // A vocabulary split over tensor-parallel ranks is reduced over them, chunk by chunk.
  bool handles_vocab_parallel_head() const override { return true; }

  tessera::LossSum compute_from_hidden(const at::Tensor& hidden, const tessera::OutputHead& head,
                                       const at::Tensor& labels) override {
    // Without chunk_size the whole logits, as the SDK's default does (an evaluation may ask);
    // with the vocabulary split over ranks, reduced over them in one chunk instead.
    if (chunk_size_ <= 0 && !head.vocab_parallel()) return tessera::Loss::compute_from_hidden(hidden, head, labels);
    const at::Tensor flat_hidden = hidden.reshape({-1, hidden.size(-1)});
    const at::Tensor flat_labels = labels.reshape({-1});
    const std::int64_t chunk = chunk_size_ > 0 ? chunk_size_ : std::max<std::int64_t>(flat_hidden.size(0), 1);
    at::Tensor sum = tessera_plugins::chunked_linear_cross_entropy(flat_hidden, head, flat_labels, chunk,
                                                                   label_smoothing_, tessera::kIgnoreIndex);
    at::Tensor count = flat_labels.ne(tessera::kIgnoreIndex).sum(at::kLong);
    return {std::move(sum), std::move(count)};
  }

 private:
  double label_smoothing_;
  std::int64_t chunk_size_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Loss, CrossEntropyConfig>(
      "cross_entropy", "summed token cross-entropy in float32, ignoring padded labels",
      [](const CrossEntropyConfig& c) { return std::make_shared<CrossEntropyLoss>(c); });
}

}  // namespace

TESSERA_PLUGIN("loss_cross_entropy", "0.1.0", register_components)
