// Kind `loss`: returns the summed loss and the number of target tokens, never a mean, so the
// trainer can normalise by the global token count across micro-batches and ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/components/output_head.hpp"
#include "tessera/components/rollout.hpp"

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

  // Whether this loss wants the hidden states and the output head rather than the logits (it
  // computes logits chunk by chunk). The trainer then calls compute_from_hidden() for models
  // with Model::has_output_head().
  virtual bool takes_hidden_states() const { return false; }
  // hidden [batch, seq, hidden], head: the model's projection, labels [batch, seq]. The default
  // projects all tokens at once and calls compute(); with a vocabulary-parallel head it gathers
  // the whole logits first (correct for any loss; cross_entropy reduces over the vocabulary's
  // ranks instead and never gathers them).
  virtual LossSum compute_from_hidden(const at::Tensor& hidden, const OutputHead& head, const at::Tensor& labels);
  // Whether compute_from_hidden() handles a head whose vocabulary is split over tensor-parallel
  // ranks (OutputHead::vocab_parallel) itself. When false, callers use the SDK's default
  // (Loss::compute_from_hidden, which gathers the logits) for such heads, so a loss written for
  // whole logits stays right.
  virtual bool handles_vocab_parallel_head() const { return false; }

  // --- Preference optimisation: the reference model ------------------------------------------
  // Whether compute() compares the policy with a reference model (loss/dpo). The trainer then
  // runs the model first for each micro-batch, without gradients and with the adapters switched
  // off (tessera::AdaptersOff: the base, which is the policy's starting point), and passes those
  // whole logits to take_reference() before compute() gets the policy's.
  virtual bool needs_reference() const { return false; }
  virtual void take_reference(const at::Tensor& /*logits*/, const at::Tensor& /*labels*/) {}

  // --- Reinforcement learning: rollouts (tessera/components/rollout.hpp) ----------------------
  // Non-null for a loss that trains on the model's own completions: how to sample and score them.
  // The trainer then takes prompts, not batches, and calls take_rollout() before each compute().
  // With needs_reference() too, take_reference() gets the reference's logits of the same rows.
  virtual const RolloutSettings* rollouts() const { return nullptr; }
  virtual void take_rollout(const RolloutRows& /*rows*/) {}

  // Named metrics of a step (DPO's rewards and log-probabilities). After each step the trainer
  // takes the sums the loss kept over its micro-batches: a tensor of metric_names().size() + 1
  // values, the last the count they are means over; it sums them over the data-parallel ranks and
  // reports each sum / count in StepMetrics::extra. Taking them starts new sums.
  virtual std::vector<std::string> metric_names() const { return {}; }
  virtual at::Tensor take_metric_sums() { return {}; }
};

// The reference model's whole logits [batch, seq, vocab] for a batch's input ids and document ids
// (undefined where the batch has none): what Loss::take_reference is given. The trainer provides
// it to evaluations (CallbackContext::reference_logits), as it runs it before training forwards.
using ReferenceLogits = std::function<at::Tensor(const at::Tensor& input_ids, const at::Tensor& document_ids)>;

// loss.compute_from_hidden(hidden, head, labels), or the SDK's default (whole logits gathered)
// where the head is vocabulary-parallel and the loss does not handle that itself.
TESSERA_API LossSum loss_from_hidden(Loss& loss, const at::Tensor& hidden, const OutputHead& head,
                                     const at::Tensor& labels);

}  // namespace tessera
