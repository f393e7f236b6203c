// What a loss asks of the trainer beyond the policy's logits: the reference model's forward
// (Loss::needs_reference, loss/dpo) and the step metrics it keeps (Loss::metric_names).
#include <ATen/core/grad_mode.h>

#include <string>
#include <vector>

#include "tessera/core/train/trainer.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/run/precision.hpp"

namespace tessera::core {

// The frozen copy of the starting weights that a full fine-tuning run's reference is: taken once,
// before the first update (the weights are then init_from's, or the model's initialisation).
void Trainer::keep_reference_copy() {
  if (keeps_reference_copy_ && !strategy_.keeps_reference_weights()) strategy_.keep_reference_weights(*parts_.model);
}

// The reference model's logits for the loss (loss/dpo): the same forward without gradients, from
// the base with the adapters switched off (no second copy) or, without adapters, from the frozen
// copy the strategy swaps in. In evaluation mode, as a reference model is held: no dropout, and a
// routed model's training statistics (expert loads for the bias update, the MoE monitor's sums)
// count the policy alone. Under an autocast region of its own, whose cached weight casts end
// with it.
at::Tensor Trainer::reference_logits(const at::Tensor& input_ids, const at::Tensor& documents) {
  at::NoGradGuard no_grad;
  struct EvalMode {
    Model& model;
    explicit EvalMode(Model& m) : model(m) { model.eval(); }
    ~EvalMode() { model.train(); }
  } eval_mode(*parts_.model);
  const std::int64_t step = progress_.step + 1;
  at::Tensor logits;
  auto forward = [&] {
    AutocastGuard autocast(device_, compute_dtype_);
    if (hidden_loss_) {
      const at::Tensor hidden = in_component(parts_.names.model, "reference forward", step,
                                             [&] { return parts_.model->forward_hidden(input_ids, documents); });
      const OutputHead& head = parts_.model->output_head();
      logits = head.logits(hidden);
      if (head.vocab_parallel()) logits = collectives::gather_from(logits, -1, head.vocab_group);
      logits = head.real_logits(logits);
    } else {
      logits = in_component(parts_.names.model, "reference forward", step,
                            [&] { return parts_.model->forward(input_ids, documents); });
    }
  };
  if (keeps_reference_copy_) {
    keep_reference_copy();
    strategy_.with_reference_weights(forward);
  } else {
    AdaptersOff base_only;
    forward();
  }
  return logits;
}

void Trainer::reference_pass(const at::Tensor& input_ids, const at::Tensor& labels, const at::Tensor& documents) {
  const at::Tensor logits = reference_logits(input_ids, documents);
  in_component(parts_.names.loss, "take_reference", progress_.step + 1,
               [&] { parts_.loss->take_reference(logits, labels); });
}

// For evaluations (CallbackContext::reference_logits, tessera eval).
ReferenceLogits Trainer::reference_forward() {
  return [this](const at::Tensor& input_ids, const at::Tensor& documents) { return reference_logits(input_ids, documents); };
}

// The loss's own metrics (loss/dpo's rewards and log-probabilities): its sums over this rank's
// micro-batches, summed over the data-parallel ranks (tensor-parallel peers hold the same), as
// means. A host copy after the step's update, like the memory figures.
void Trainer::add_loss_metrics(StepMetrics& m) {
  const std::vector<std::string> names = parts_.loss->metric_names();
  if (names.empty()) return;
  at::Tensor sums = parts_.loss->take_metric_sums();
  if (!sums.defined() || sums.numel() != static_cast<std::int64_t>(names.size()) + 1) return;
  sums = sums.to(at::kCPU, at::kDouble).contiguous();
  mesh_->data_parallel().all_reduce(sums);
  const double* v = sums.const_data_ptr<double>();
  const double count = v[names.size()];
  if (count <= 0) return;
  for (std::size_t i = 0; i < names.size(); ++i) m.extra[names[i]] = v[i] / count;
}

}  // namespace tessera::core
