// What a loss asks of the trainer beyond the policy's logits: the reference model's forward
// (Loss::needs_reference, loss/dpo) and the step metrics it keeps (Loss::metric_names).
#include <ATen/core/grad_mode.h>
#include <ATen/ops/linear.h>

#include <string>
#include <vector>

#include "tessera/core/train/trainer.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/run/communicator.hpp"

namespace tessera::core {

// The reference model's logits for the loss (loss/dpo): the same forward without gradients and
// with the adapters switched off, so the reference is the frozen base with no second copy. In
// evaluation mode, as a reference model is held: no dropout, and a routed model's training
// statistics (expert loads for the bias update, the MoE monitor's sums) count the policy alone.
void Trainer::reference_pass(const at::Tensor& input_ids, const at::Tensor& labels, const at::Tensor& documents) {
  at::NoGradGuard no_grad;
  AdaptersOff base_only;
  struct EvalMode {
    Model& model;
    explicit EvalMode(Model& m) : model(m) { model.eval(); }
    ~EvalMode() { model.train(); }
  } eval_mode(*parts_.model);
  const std::int64_t step = progress_.step + 1;
  at::Tensor logits;
  if (hidden_loss_) {
    const at::Tensor hidden = in_component(parts_.names.model, "reference forward", step,
                                           [&] { return parts_.model->forward_hidden(input_ids, documents); });
    const OutputHead& head = parts_.model->output_head();
    logits = at::linear(hidden, head.weight, head.bias);
    if (head.vocab_parallel()) logits = collectives::gather_from(logits, -1, head.vocab_group);
  } else {
    logits = in_component(parts_.names.model, "reference forward", step,
                          [&] { return parts_.model->forward(input_ids, documents); });
  }
  in_component(parts_.names.loss, "take_reference", step, [&] { parts_.loss->take_reference(logits, labels); });
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
