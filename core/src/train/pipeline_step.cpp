// One step's forwards and backwards under pipeline parallelism: this rank's stages run the step's
// micro-batches in the schedule's order (pipeline_schedule.hpp). A stage receives its input from
// the stage before (a leaf that requires grad, so backward leaves its gradient there to send
// back), and the last stage computes the loss from the hidden states and the output head. Sends
// return at once and are waited for at the step's end; every receive waits for its data.
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "tessera/core/train/pipeline_schedule.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/run/precision.hpp"
#include "step_inputs.hpp"

namespace tessera::core {

namespace {

// A transfer's tag: the stage it leaves, its direction and its micro-batch, unique within a step.
std::int64_t transfer_tag(std::int64_t from_stage, bool gradient, std::int64_t micro_batch, std::int64_t micro_batches) {
  return (from_stage * 2 + (gradient ? 1 : 0)) * micro_batches + micro_batch;
}

}  // namespace

at::Tensor Trainer::pipeline_forward_backward(StepInputs& inputs, CallbackContext& ctx) {
  const auto m = static_cast<std::int64_t>(inputs.micro_batches.size());
  const double inv_tokens = inputs.inv_tokens();
  // A model's own loss terms (MoE balancing), each stage's from its own blocks, weighted as in
  // forward_backward.
  const double aux_weight = 1.0 / static_cast<double>(m * mesh_->data_parallel().world_size() * cp_.size());
  const ParallelDims& dims = mesh_->dims();
  const std::vector<PipelineAction> actions =
      pipeline_schedule(dims.pp_schedule, pp_->size(), pp_->stages_per_rank(), pp_->rank(), m);
  std::vector<MicroBatchInputs> batches;
  for (const Batch& batch : inputs.micro_batches) batches.push_back(MicroBatchInputs::copied_to(device_, batch, inv_tokens));
  // What a forward leaves for its backward: the stage's input (to send its gradient back), its
  // output (the loss on the last stage) and its auxiliary loss.
  struct InFlight {
    at::Tensor input, output, aux;
  };
  std::map<std::pair<std::int64_t, std::int64_t>, InFlight> in_flight;  // (stage, micro-batch)
  std::vector<at::Tensor> micro_losses(static_cast<std::size_t>(m));
  PendingSends sends;
  // The time this rank waits for another stage: its share of the pipeline's bubble, measured.
  auto waited = [this](auto&& receive) {
    const auto begin = std::chrono::steady_clock::now();
    at::Tensor t = receive();
    pipeline_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    return t;
  };
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  const std::int64_t step = progress_.step + 1;
  const std::int64_t last_local_stage = pp_->local_stages().back().index;
  for (const PipelineAction& action : actions) {
    const std::int64_t local = pp_->local_index(action.stage);
    const PipelineStage& stage = pp_->local_stages()[static_cast<std::size_t>(local)];
    const std::int64_t mb = action.micro_batch;
    const MicroBatchInputs& in = batches[static_cast<std::size_t>(mb)];
    InFlight& flight = in_flight[{action.stage, mb}];
    if (action.kind == PipelineAction::Kind::forward) {
      if (!stage.first) {
        flight.input =
            waited([&] { return pp_->receive(action.stage - 1, transfer_tag(action.stage - 1, false, mb, m), device_); });
        flight.input.requires_grad_(true);
      }
      AutocastGuard autocast(device_, compute_dtype_);
      const at::Tensor out = in_component(parts_.names.model, "forward", step, [&] {
        return parts_.model->forward_stage(static_cast<std::size_t>(local), in.input_ids, flight.input, in.document_ids);
      });
      if (at::Tensor aux = parts_.model->auxiliary_loss(); aux.defined()) flight.aux = aux * aux_weight;
      if (stage.last) {
        // Under context parallelism the hidden states are this rank's slice of the sequence.
        const LossSum loss = in_component(parts_.names.loss, "forward", step, [&] {
          return loss_from_hidden(*parts_.loss, out, parts_.model->output_head(), cp_.slice(in.labels));
        });
        flight.output = loss.sum * in.inv_tokens;
        micro_losses[static_cast<std::size_t>(mb)] = loss.sum.detach();
        loss_sum += micro_losses[static_cast<std::size_t>(mb)];
      } else {
        flight.output = out;
        pp_->send(out, action.stage + 1, transfer_tag(action.stage, false, mb, m), sends);
      }
      continue;
    }
    // Backward: from the loss on the last stage, else from the gradient the next stage sent.
    strategy_.begin_micro_batch(mb, m);
    std::vector<at::Tensor> outputs{flight.output};
    std::vector<at::Tensor> grads;
    grads.push_back(stage.last ? at::ones_like(flight.output) : waited([&] {
      return pp_->receive(action.stage + 1, transfer_tag(action.stage + 1, true, mb, m), device_, PipelineFlow::gradients);
    }));
    // Its gradient came back, so the activation sent for it arrived: its buffer may go.
    if (!stage.last) sends.wait(transfer_tag(action.stage, false, mb, m));
    if (flight.aux.defined()) {
      outputs.push_back(flight.aux);
      grads.push_back(at::ones_like(flight.aux));
    }
    in_component(parts_.names.model + " with " + parts_.names.loss, "backward", step,
                 [&] { torch::autograd::backward(outputs, grads); });
    if (!stage.first) {
      pp_->send(flight.input.grad(), action.stage - 1, transfer_tag(action.stage, true, mb, m), sends,
                PipelineFlow::gradients);
    }
    in_flight.erase({action.stage, mb});
    if (action.stage == last_local_stage && !parts_.callbacks.empty()) {
      // This rank's share of the micro-batch is done; its loss is known on the last stage only.
      const at::Tensor& loss = micro_losses[static_cast<std::size_t>(mb)];
      const MicroBatchEnd end{mb, m, loss.defined() ? loss : at::zeros_like(loss_sum),
                              inputs.micro_batches[static_cast<std::size_t>(mb)].num_target_tokens};
      for_each_callback("on_micro_batch_end", step, [&](Callback& cb) { cb.on_micro_batch_end(ctx, end); });
    }
  }
  waited([&] {
    sends.wait();
    return at::Tensor();
  });
  inputs.micro_batches.clear();
  return loss_sum;
}

}  // namespace tessera::core
