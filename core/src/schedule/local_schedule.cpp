// A step's micro-batches one after another through the whole model (step_schedule.hpp).
#include <ATen/ops/zeros.h>

#include <optional>

#include "step_schedule.hpp"

namespace tessera::core {

// Dividing every micro-batch's summed loss by the step's token count makes the accumulated
// gradient exactly that of one big batch, however unevenly tokens fall across micro-batches.
at::Tensor Trainer::LocalSchedule::forward_backward(StepInputs& inputs, CallbackContext& ctx) {
  const double inv_tokens = inputs.inv_tokens();
  // A model's own loss terms (MoE balancing) are means per forward: each micro-batch of each
  // rank contributes 1/(micro-batches x ranks), so the step optimises their mean.
  // (The gradient group's ranks: each context-parallel rank's forward covers its slice of the
  // micro-batch.)
  const double aux_weight =
      1.0 / static_cast<double>(t_.settings_.grad_accum * t_.mesh_->gradient_group().world_size());
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(t_.device_));
  std::optional<MicroBatchGraph::StepScope> on_graph_stream;
  if (t_.graph_) on_graph_stream.emplace(*t_.graph_);
  const MicroBatchGraph::Body body = [&](const MicroBatchInputs& in) { return t_.micro_batch(in, aux_weight); };
  for (std::size_t i = 0; i < inputs.micro_batches.size(); ++i) {
    Batch& batch = inputs.micro_batches[i];
    t_.strategy_.begin_micro_batch(static_cast<std::int64_t>(i), t_.settings_.grad_accum);
    const at::Tensor micro_loss = t_.graph_ ? t_.graph_->run(batch, inv_tokens, body)
                                         : body(MicroBatchInputs::copied_to(t_.device_, batch, inv_tokens));
    loss_sum += micro_loss;
    if (!t_.parts_.callbacks.empty()) {
      // A replay's loss is the graph's output, which the next replay overwrites.
      const MicroBatchEnd end{static_cast<std::int64_t>(i), t_.settings_.grad_accum,
                              t_.graph_ ? micro_loss.clone() : micro_loss, batch.num_target_tokens};
      t_.for_each_callback("on_micro_batch_end", t_.progress_.step + 1, [&](Callback& cb) { cb.on_micro_batch_end(ctx, end); });
    }
  }
  inputs.micro_batches.clear();
  return loss_sum;
}

}  // namespace tessera::core
