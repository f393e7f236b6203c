// One step's forwards and backwards under pipeline parallelism: this rank's stages run the step's
// micro-batches in the schedule's order (pipeline_schedule.hpp). A stage receives its input from
// the stage before (a leaf that requires grad, so backward leaves its gradient there to send
// back), and the last stage computes the loss from the hidden states and the output head. Sends
// return at once and are waited for at the step's end; every receive waits for its data.
#include <ATen/ops/empty.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/log.hpp"
#include "tessera/run/precision.hpp"
#include "step_schedule.hpp"

namespace tessera::core {

namespace {

// A transfer's tag: the stage it leaves, its direction and its micro-batch, unique within a step.
std::int64_t transfer_tag(std::int64_t from_stage, bool gradient, std::int64_t micro_batch, std::int64_t micro_batches) {
  return (from_stage * 2 + (gradient ? 1 : 0)) * micro_batches + micro_batch;
}

}  // namespace

Trainer::PipelineSchedule::PipelineSchedule(Trainer& trainer)
    : StepSchedule(trainer), pipeline_(PipelineParallel::transport_of(trainer.context_)) {
  // Which blocks a stage holds is the model's business; the trainer moves data between stages.
  if (!t_.parts_.model->has_output_head()) {
    throw Error("trainer: parallelism.pp needs a model that exposes its hidden states and output head");
  }
  // Exports are made on rank 0 from the whole model: it keeps every stage's adapter tensors
  // apart from the base, or has them merged, so it needs all their names.
  if (!t_.parts_.adapters.empty()) {
    StateDict names;
    for (const std::string& name : t_.parts_.adapter_parameters) names[name] = at::empty({0}, at::kByte);
    for (const auto& item : gather_state_dicts(names, *pipeline_.group())) t_.parts_.adapter_parameters.insert(item.first);
  }
}

at::Tensor Trainer::PipelineSchedule::forward_backward(StepInputs& inputs, CallbackContext& ctx) {
  const auto m = static_cast<std::int64_t>(inputs.micro_batches.size());
  const double inv_tokens = inputs.inv_tokens();
  // A model's own loss terms (MoE balancing), each stage's from its own blocks, weighted as in
  // forward_backward.
  const double aux_weight = 1.0 / static_cast<double>(m * t_.mesh_->gradient_group().world_size());
  const ParallelDims& dims = t_.mesh_->dims();
  const std::vector<PipelineAction> actions =
      pipeline_schedule(dims.pp_schedule, pipeline_.size(), pipeline_.stages_per_rank(), pipeline_.rank(), m);
  std::vector<MicroBatchInputs> batches;
  for (const Batch& batch : inputs.micro_batches) batches.push_back(MicroBatchInputs::copied_to(t_.device_, batch, inv_tokens));
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
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    return t;
  };
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(t_.device_));
  const std::int64_t step = t_.progress_.step + 1;
  const std::int64_t last_local_stage = pipeline_.local_stages().back().index;
  for (const PipelineAction& action : actions) {
    const std::int64_t local = pipeline_.local_index(action.stage);
    const PipelineStage& stage = pipeline_.local_stages()[static_cast<std::size_t>(local)];
    const std::int64_t mb = action.micro_batch;
    const MicroBatchInputs& in = batches[static_cast<std::size_t>(mb)];
    InFlight& flight = in_flight[{action.stage, mb}];
    if (action.kind == PipelineAction::Kind::forward) {
      if (!stage.first) {
        flight.input =
            waited([&] { return pipeline_.receive(action.stage - 1, transfer_tag(action.stage - 1, false, mb, m), t_.device_); });
        flight.input.requires_grad_(true);
      }
      AutocastGuard autocast(t_.device_, t_.compute_dtype_);
      const at::Tensor out = in_component(t_.parts_.names.model, "forward", step, [&] {
        return t_.parts_.model->forward_stage(static_cast<std::size_t>(local), in.input_ids, flight.input, in.document_ids);
      });
      if (at::Tensor aux = t_.parts_.model->auxiliary_loss(); aux.defined()) flight.aux = aux * aux_weight;
      if (stage.last) {
        // Under context parallelism the hidden states are this rank's slice of the sequence.
        const LossSum loss = in_component(t_.parts_.names.loss, "forward", step, [&] {
          return loss_from_hidden(*t_.parts_.loss, out, t_.parts_.model->output_head(), labels_of_slice(in.labels));
        });
        flight.output = loss.sum * in.inv_tokens;
        micro_losses[static_cast<std::size_t>(mb)] = loss.sum.detach();
        loss_sum += micro_losses[static_cast<std::size_t>(mb)];
      } else {
        flight.output = out;
        pipeline_.send(out, action.stage + 1, transfer_tag(action.stage, false, mb, m), sends);
      }
      continue;
    }
    // Backward: from the loss on the last stage, else from the gradient the next stage sent.
    t_.strategy_.begin_micro_batch(mb, m);
    std::vector<at::Tensor> outputs{flight.output};
    std::vector<at::Tensor> grads;
    grads.push_back(stage.last ? at::ones_like(flight.output) : waited([&] {
      return pipeline_.receive(action.stage + 1, transfer_tag(action.stage + 1, true, mb, m), t_.device_, PipelineFlow::gradients);
    }));
    // Its gradient came back, so the activation sent for it arrived: its buffer may go.
    if (!stage.last) sends.wait(transfer_tag(action.stage, false, mb, m));
    if (flight.aux.defined()) {
      outputs.push_back(flight.aux);
      grads.push_back(at::ones_like(flight.aux));
    }
    in_component(t_.parts_.names.model + " with " + t_.parts_.names.loss, "backward", step,
                 [&] { torch::autograd::backward(outputs, grads); });
    if (!stage.first) {
      pipeline_.send(flight.input.grad(), action.stage - 1, transfer_tag(action.stage, true, mb, m), sends,
                PipelineFlow::gradients);
    }
    in_flight.erase({action.stage, mb});
    if (action.stage == last_local_stage && !t_.parts_.callbacks.empty()) {
      // This rank's share of the micro-batch is done; its loss is known on the last stage only.
      const at::Tensor& loss = micro_losses[static_cast<std::size_t>(mb)];
      const MicroBatchEnd end{mb, m, loss.defined() ? loss : at::zeros_like(loss_sum),
                              inputs.micro_batches[static_cast<std::size_t>(mb)].num_target_tokens};
      t_.for_each_callback("on_micro_batch_end", step, [&](Callback& cb) { cb.on_micro_batch_end(ctx, end); });
    }
  }
  waited([&] {
    sends.wait();
    return at::Tensor();
  });
  inputs.micro_batches.clear();
  return loss_sum;
}


// A pipeline's tied embedding: each end computed its use's gradient (the first the embedding's,
// the last the head's); both take their sum, so the two copies stay equal after the update.
void Trainer::PipelineSchedule::finish_gradients() {
  if (t_.parts_.model->pipeline_tied_parameters().empty()) return;
  const std::shared_ptr<Communicator> ends = t_.mesh_->pipeline_ends_ptr();
  if (ends->world_size() == 1) return;
  const auto named = t_.parts_.model->named_parameters();
  for (const std::string& name : t_.parts_.model->pipeline_tied_parameters()) {
    const at::Tensor* param = named.find(name);
    if (!param) throw Error("trainer: " + t_.parts_.names.model + " ties " + name + " across the pipeline but has none");
    if (!param->requires_grad()) continue;  // frozen by adapters on both ends alike: no gradient to sum
    at::Tensor grad = t_.strategy_.gradient_of(*param);
    // A rank whose shard holds none of it still takes part, with nothing to add.
    at::Tensor part = grad.defined() ? grad : at::zeros({0}, param->options());
    ends->all_reduce(part);
  }
}

void Trainer::PipelineSchedule::record(StepMetrics& m, const MemoryStats& memory) {
  // What this rank's stages spent waiting for the others, against the analytic bubble.
  const double idle = m.time_forward_backward_s > 0 ? wait_s_ / m.time_forward_backward_s : 0.0;
  m.extra["pipeline_idle_share"] = idle;
  idle_shares_.push_back(idle);
  activation_bytes_.push_back(static_cast<double>(memory.peak - memory.in_use));
  wait_s_ = 0;
}

void Trainer::PipelineSchedule::log_summary() const {
  // The first step warms up (allocations, first collectives): medians over the rest.
  if (idle_shares_.size() < 2) return;
  auto median_after_first = [](std::vector<double> v) {
    v.erase(v.begin());
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  std::string stages;
  for (const PipelineStage& s : pipeline_.local_stages()) stages += (stages.empty() ? "" : ",") + std::to_string(s.index);
  const ParallelDims& dims = t_.mesh_->dims();
  log::info("pipeline rank ", pipeline_.rank(), " (stages ", stages, "): idle share ", median_after_first(idle_shares_),
            " (analytic bubble ", pipeline_bubble(dims.pp_schedule, dims.pp, pipeline_.stages_per_rank(), t_.settings_.grad_accum),
            "), activation peak ", static_cast<std::int64_t>(median_after_first(activation_bytes_)),
            " B (medians over steps 2-", idle_shares_.size(), ")");
}

}  // namespace tessera::core
