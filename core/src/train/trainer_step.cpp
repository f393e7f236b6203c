// One optimizer step, phase by phase: fetch the micro-batches, forward and backward each, reduce
// the loss and the gradient norm over ranks, let callbacks judge the step, update the weights,
// record the metrics. Each phase is one function; step() shows them in order.
// The forwards and backwards are the schedule's (step_schedule.hpp).
#include <ATen/ops/_foreach_zero.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "tessera/run/batch.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/core/process/failpoint.hpp"
#include "tessera/core/train/gradient_clipping.hpp"
#include "tessera/run/token_check.hpp"
#include "tessera/core/train/trainer.hpp"
#include "../schedule/step_schedule.hpp"
#include "tessera/run/human_format.hpp"
#include "tessera/log.hpp"
#include "tessera/run/memory_stats.hpp"
#include "tessera/run/precision.hpp"

namespace tessera::core {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

struct Trainer::StepClock {
  Clock::time_point begin, data, backward, optimizer;
  double waited_before = 0;  // the mesh's wait time when the step began
  std::int64_t bytes_before = 0;  // the mesh's communicated bytes when the step began
  std::map<std::string, std::int64_t> group_bytes_before;  // the same by group
};

StepMetrics Trainer::step() {
  if (progress_.step == 0 && started_ == Clock::time_point{}) started_ = Clock::now();
  StepClock clock{Clock::now(), {}, {}, {}, mesh_->wait_seconds(), mesh_->bytes_communicated(),
                  mesh_->bytes_communicated_by_group()};
  if (control_.skip_requested()) {
    // Asked after the last optimizer step (on_collect_metrics, on_step_end, an evaluation):
    // skipping a later, healthy step instead would be wrong.
    log::warn("a skip requested after step ", progress_.step, "'s optimizer step is dropped; "
              "request skips up to on_before_optimizer_step");
    control_.clear_skip();
  }
  CallbackContext ctx = callback_context();
  for_each_callback("on_step_begin", progress_.step + 1, [&](Callback& cb) { cb.on_step_begin(ctx); });
  failpoint("trainer.step");

  StepInputs inputs = fetch();
  clock.data = Clock::now();
  const at::Tensor loss_sum = schedule_->forward_backward(inputs, ctx);
  clock.backward = Clock::now();
  const LossAndGradNorm reduced = reduce(loss_sum, inputs);
  const SkipDecision decision = agree_on_skip(ctx, reduced);
  const double lr = update(reduced.grad_norm, decision.skip);
  clock.optimizer = Clock::now();
  if (decision.judged_later) {
    pending_nonfinite_ = PendingNonfinite{progress_.step + 1, decision.values};
  } else {
    judge_nonfinite(progress_.step + 1, decision.nonfinite, *decision.values);
  }
  StepMetrics m = record(ctx, inputs, lr, decision, clock);
  if (nonfinite_total_ > 0) m.extra["nonfinite_steps"] = static_cast<double>(nonfinite_total_);
  return m;
}

// All micro-batches are drawn first: the loss divisor is the target-token count of the whole
// step over all ranks, known on the host before any forward pass.
Trainer::StepInputs Trainer::fetch() {
  if (rollout_settings_) return fetch_rollout();
  StepInputs in;
  in.micro_batches.reserve(static_cast<std::size_t>(settings_.grad_accum));
  for (std::int64_t i = 0; i < settings_.grad_accum; ++i) {
    in.micro_batches.push_back(in_component(parts_.names.train_data, "next_batch", progress_.step + 1, [&] {
      Batch batch = parts_.train_data->next_batch(settings_.micro_batch_size);
      check_token_ids(batch, vocab_size_);
      return batch;
    }));
    in.count(in.micro_batches.back());
  }
  sum_over_ranks(in);
  return in;
}

// Counted on the host, so summing them needs no device synchronisation (an NCCL run reduces
// host tensors on its Gloo group); with one rank the collective returns at once. Over the
// data-parallel ranks: tensor-parallel peers read the same batches.
void Trainer::sum_over_ranks(StepInputs& in) {
  at::Tensor counts = at::tensor({in.target_tokens, in.input_tokens, in.samples}, at::kLong);
  mesh_->data_parallel().all_reduce(counts);
  in.target_tokens = counts[0].item<std::int64_t>();
  in.input_tokens = counts[1].item<std::int64_t>();
  in.samples = counts[2].item<std::int64_t>();
}

at::Tensor Trainer::micro_batch(const MicroBatchInputs& in, double aux_weight) {
  hand_rollout_rows();
  LossSum loss = forward_loss(in.input_ids, in.labels, in.document_ids);
  at::Tensor objective = loss.sum * in.inv_tokens;
  if (at::Tensor aux = parts_.model->auxiliary_loss(); aux.defined()) objective = objective + aux * aux_weight;
  in_component(parts_.names.model + " with " + parts_.names.loss, "backward", progress_.step + 1,
               [&] { objective.backward(); });
  return loss.sum.detach();
}

// The forward pass and the loss, under autocast when the run computes in bf16 (backward then
// runs in the dtypes the forward chose). A loss that takes hidden states gets them and the
// model's output head, so the whole [tokens, vocab] logits never exist.
LossSum Trainer::forward_loss(const at::Tensor& input_ids, const at::Tensor& labels, const at::Tensor& documents) {
  if (documents.defined() && !parts_.model->masks_documents() && !warned_unmasked_documents_) {
    log::warn("the data packs documents (document_ids) but this model does not mask them: tokens attend across "
              "document boundaries");
    warned_unmasked_documents_ = true;
  }
  // Before the policy's autocast region: a cast of a weight cached there must not outlive a
  // reference pass that swapped the weights' memory (reference_pass has its own region).
  if (needs_reference_) reference_pass(input_ids, labels, documents);
  AutocastGuard autocast(device_, compute_dtype_);
  const std::int64_t step = progress_.step + 1;
  if (hidden_loss_) {
    const at::Tensor hidden =
        in_component(parts_.names.model, "forward", step, [&] { return parts_.model->forward_hidden(input_ids, documents); });
    // Under context parallelism the hidden states are this rank's slice of the sequence.
    const at::Tensor targets = schedule_->labels_of_slice(labels);
    return in_component(parts_.names.loss, "forward", step,
                        [&] { return loss_from_hidden(*parts_.loss, hidden, parts_.model->output_head(), targets); });
  }
  const at::Tensor logits =
      in_component(parts_.names.model, "forward", step, [&] { return parts_.model->forward(input_ids, documents); });
  return in_component(parts_.names.loss, "forward", step, [&] { return parts_.loss->compute(logits, labels); });
}

// The gradients complete, then the step's loss (all ranks, per target token) and the global
// gradient norm, both still on the device.
LossAndGradNorm Trainer::reduce(const at::Tensor& loss_sum, const StepInputs& inputs) {
  strategy_.finish_gradients();
  schedule_->finish_gradients();
  // Over every rank; tensor-parallel peers hold the same loss, a replicated value whose first copy
  // alone counts (as their replicated gradients do), and only the ranks that compute one have it.
  const bool counts_loss = placements_.tensor_ranks().rank == 0 && schedule_->computes_loss();
  const at::Tensor counted_loss = counts_loss ? loss_sum : at::zeros_like(loss_sum);
  LossAndGradNorm reduced = strategy_.reduce_loss_and_grad_norm(mesh_->loss_group(), counted_loss);
  reduced.loss_sum = reduced.loss_sum * inputs.inv_tokens();  // from here on the step's loss
  return reduced;
}

// Callbacks see the loss and the norm and may ask to skip; a skip asked on one rank skips the
// step on all (replicas must stay identical, and sharded optimizer steps are collectives).
// Unless trainer.nonfinite is ignore, a NaN/Inf loss or gradient norm skips it too. The two
// values are global already, so every rank computes the same flag. Where the optimizer can skip
// on the device (fused AdamW), it gets the flag as a device scalar and the update is launched at
// once; nobody waits for the flag: it is judged at the next step (settle_pending_nonfinite).
// Otherwise the flag is read here and agreed with the requests, a wait for the device before the
// update. A run that the previous step's flag ends (trainer.nonfinite) applies no further update.
Trainer::SkipDecision Trainer::agree_on_skip(CallbackContext& ctx, const LossAndGradNorm& reduced) {
  settle_pending_nonfinite();
  if (!parts_.callbacks.empty()) {
    const BeforeOptimizerStep before{reduced.grad_norm, reduced.loss_sum};
    for_each_callback("on_before_optimizer_step", progress_.step + 1, [&](Callback& cb) { cb.on_before_optimizer_step(ctx, before); });
  }
  const at::Tensor loss = reduced.loss_sum.to(at::kFloat);
  at::Tensor found_inf;  // float32 0/1 on the device
  if (settings_.nonfinite != "ignore") {
    found_inf = at::isfinite(reduced.loss_sum).logical_and(at::isfinite(reduced.grad_norm)).logical_not().to(at::kFloat);
  }
  const bool on_device = found_inf.defined() && parts_.optimizer->can_skip_on_device();
  const bool nonfinite = found_inf.defined() && !on_device && found_inf.item<float>() != 0;
  at::Tensor flags = at::tensor({static_cast<std::int64_t>(control_.skip_requested() ? 1 : 0),
                                 static_cast<std::int64_t>(nonfinite ? 1 : 0)}, at::kLong);
  control_.clear_skip();
  context_.communicator->all_reduce(flags, ReduceOp::max);
  SkipDecision decision;
  decision.nonfinite = flags[1].item<std::int64_t>() != 0;
  // nonfinite_failure_ is the same on every rank: it comes from global values.
  decision.skip = flags[0].item<std::int64_t>() != 0 || decision.nonfinite || !nonfinite_failure_.empty();
  decision.values = AsyncValues::copy_of(at::stack({found_inf.defined() ? found_inf : at::zeros_like(loss), loss,
                                                    reduced.grad_norm.to(loss.device(), at::kFloat)}));
  decision.judged_later = on_device;
  if (on_device && !decision.skip) {
    in_component(parts_.names.optimizer, "skip_next_step_if", progress_.step + 1,
                 [&] { parts_.optimizer->skip_next_step_if(found_inf); });
  }
  return decision;
}

void Trainer::settle_pending_nonfinite() {
  if (!pending_nonfinite_) return;
  const PendingNonfinite pending = std::move(*pending_nonfinite_);
  pending_nonfinite_.reset();
  judge_nonfinite(pending.step, pending.values->at(SkipDecision::kFlag) != 0, *pending.values);
}

void Trainer::judge_nonfinite(std::int64_t step, bool nonfinite, const AsyncValues& values) {
  if (!nonfinite) {
    nonfinite_in_a_row_ = 0;
    return;
  }
  ++nonfinite_in_a_row_;
  ++nonfinite_total_;
  const double loss = values.at(SkipDecision::kLoss), norm = values.at(SkipDecision::kGradNorm);
  const std::string what = "step " + std::to_string(step) + " has a non-finite " +
                           (std::isfinite(loss) ? "gradient norm (" + human::format("%g", norm) + ")"
                                                : "loss (" + human::format("%g", loss) + ")");
  if (!nonfinite_failure_.empty()) return;  // the run ends already
  if (settings_.nonfinite == "stop") {
    nonfinite_failure_ = what + "; its update was not applied, nor any later one, and trainer.nonfinite is stop";
  } else if (nonfinite_in_a_row_ >= settings_.nonfinite_max_consecutive) {
    nonfinite_failure_ = what + "; that is " + std::to_string(nonfinite_in_a_row_) +
                         " non-finite steps in a row (trainer.nonfinite_max_consecutive " +
                         std::to_string(settings_.nonfinite_max_consecutive) +
                         "): training has diverged; lower the learning rate, clip gradients or check the data";
  }
  if (context_.rank == 0) {
    log::warn(what, "; the update is skipped (", nonfinite_in_a_row_, " in a row, ", nonfinite_total_,
              " in this run; trainer.nonfinite: ", settings_.nonfinite, ")");
  }
}

// Clipping by the global norm (one multi-tensor scale, no host sync), the scheduled learning
// rate, the strategy's optimizer step, and gradients cleared. Returns the learning rate.
double Trainer::update(const at::Tensor& grad_norm, bool skipped) {
  const double base_lr = parts_.optimizer->base_lr();
  const double lr = parts_.scheduler ? in_component(parts_.names.scheduler, "lr", progress_.step + 1,
                                                    [&] { return parts_.scheduler->lr(progress_.step, base_lr); })
                                     : base_lr;
  if (!skipped) {
    std::vector<at::Tensor> grads = strategy_.gradients();
    if (settings_.clip_grad_norm > 0) clip_gradients_by_norm(grads, grad_norm, settings_.clip_grad_norm);
    parts_.optimizer->set_lr(lr);
    in_component(parts_.names.optimizer, "step", progress_.step + 1, [&] { strategy_.optimizer_step(*parts_.optimizer); });
  }
  // The model's non-gradient state after the step (DeepSeek-V3's routing bias).
  in_component(parts_.names.model, "after_optimizer_step", progress_.step + 1,
               [&] { parts_.model->after_optimizer_step(!skipped); });
  if (graph_) {
    // The graph accumulates into these gradients' memory: zeroed in place, never released.
    std::vector<at::Tensor> grads = strategy_.gradients();
    if (!grads.empty()) at::_foreach_zero_(grads);
  } else {
    strategy_.zero_grad(*parts_.optimizer);
  }
  return lr;
}

// Progress, the step's metrics (the loss and norm copied to the host without waiting), the time
// breakdown, memory, rates and ETA, then every callback's own metrics.
StepMetrics Trainer::record(CallbackContext& ctx, const StepInputs& inputs, double lr,
                            const SkipDecision& decision, const StepClock& clock) {
  progress_.step += 1;
  progress_.tokens += inputs.input_tokens;
  progress_.samples += inputs.samples;

  StepMetrics m;
  m.step = progress_.step;
  // The loss, the norm and (where the optimizer skipped on the device) whether the update was
  // applied leave the device without the step waiting for them: read where needed.
  m.loss = MetricValue(decision.values, SkipDecision::kLoss);
  m.grad_norm = MetricValue(decision.values, SkipDecision::kGradNorm);
  m.skipped = decision.skip ? MetricValue(1.0)
                            : decision.judged_later ? MetricValue(decision.values, SkipDecision::kFlag) : MetricValue(0.0);
  const auto end = Clock::now();
  m.lr = lr;
  m.tokens = progress_.tokens;
  m.step_tokens = inputs.input_tokens;
  m.target_tokens = inputs.target_tokens;
  m.step_time_s = seconds_between(clock.begin, end);
  progress_.elapsed_s = elapsed_s();
  m.elapsed_s = progress_.elapsed_s;
  m.time_data_s = seconds_between(clock.begin, clock.data);
  m.time_forward_backward_s = seconds_between(clock.data, clock.backward);
  m.time_optimizer_s = seconds_between(clock.backward, clock.optimizer);
  m.time_communication_s = mesh_->wait_seconds() - clock.waited_before;
  // Every collective of the step and of the events before it, over all of the mesh's groups.
  if (mesh_->dims().world_size() > 1) {
    m.extra["communicated_bytes"] = static_cast<double>(mesh_->bytes_communicated() - clock.bytes_before);
    // By group, where the mesh has groups besides the world: communicated_bytes/tp, /ep, ...
    const auto by_group = mesh_->bytes_communicated_by_group();
    if (by_group.size() > 1) {
      for (const auto& [name, bytes] : by_group) {
        const auto before = clock.group_bytes_before.find(name);
        m.extra["communicated_bytes/" + name] =
            static_cast<double>(bytes - (before == clock.group_bytes_before.end() ? 0 : before->second));
      }
    }
  }
  const MemoryStats memory = memory_stats(device_);
  m.memory_in_use_bytes = memory.in_use;
  m.memory_peak_bytes = memory.peak;
  m.memory_reserved_bytes = memory.reserved;
  schedule_->record(m, memory);
  // The next peak window starts here, so it covers what runs between steps (evaluation, samples,
  // checkpoint copies) as well as the next step.
  reset_peak_memory(device_);
  fill_rates(m, inputs.seq_len, clock.begin, end);
  add_loss_metrics(m);
  m.extra.insert(rollout_metrics_.begin(), rollout_metrics_.end());
  if (pause_s_ > 0) {
    // The copy of the state a save made before this step, while training waited.
    m.extra["time_checkpoint_s"] = pause_s_;
    pause_s_ = 0;
  }
  if (graph_) m.extra["cuda_graph_replays"] = static_cast<double>(graph_->replays());
  // Optimizer state exists from the first update on (LibTorch optimizers create it lazily): the
  // first step this process runs, also when it resumed at a later one.
  if (run_steps_ == 1) {
    memory_ = measure_memory();
    log::info("memory held by rank ", context_.rank, " between steps: parameters ", memory_.parameters,
              " B, gradients ", memory_.gradients, " B, optimizer state ", memory_.optimizer_state, " B, total ",
              memory_.total(), " B");
    // The largest rank's model state, what a mesh saves per device (a host collective, once).
    at::Tensor largest = at::tensor({memory_.parameters, memory_.gradients, memory_.optimizer_state}, at::kLong);
    context_.communicator->all_reduce(largest, ReduceOp::max);
    m.extra["parameter_bytes"] = static_cast<double>(largest[0].item<std::int64_t>());
    m.extra["gradient_bytes"] = static_cast<double>(largest[1].item<std::int64_t>());
    m.extra["optimizer_bytes"] = static_cast<double>(largest[2].item<std::int64_t>());
    // Of the whole model: with adapters, the trainable ones are theirs alone.
    m.extra["parameters"] = static_cast<double>(total_parameter_count());
    m.extra["trainable_parameters"] = static_cast<double>(parameter_count());
  }
  for_each_callback_at_step_boundary("on_collect_metrics", [&](Callback& cb) { cb.on_collect_metrics(ctx, m); });
  return m;
}

MemoryReport Trainer::measure_memory() const {
  const ParallelMemory held = strategy_.memory();
  MemoryReport report;
  // A full fine-tuning run's frozen reference copy is held beside the parameters.
  report.parameters = held.parameters + strategy_.reference_bytes();
  report.gradients = held.gradients;
  report.optimizer_state = parts_.optimizer->state_bytes();
  return report;
}

void Trainer::fill_rates(StepMetrics& m, std::int64_t seq_len, Clock::time_point begin, Clock::time_point end) {
  const double devices = static_cast<double>(context_.world_size);
  m.tokens_per_s = m.step_time_s > 0 ? static_cast<double>(m.step_tokens) / m.step_time_s : 0.0;
  m.tokens_per_s_per_device = m.tokens_per_s / devices;
  if (peak_.flops) {
    m.mfu = model_flops_utilisation(flops_per_token(seq_len), m.tokens_per_s_per_device, *peak_.flops);
  }
  // The ETA's rates: wall time from the start of this process's second step (the first warms
  // up allocators and kernels) to the end of this one, so the work between steps (evaluation,
  // samples, saves, sinks) counts too. After the first step only its own time is known.
  ++run_steps_;
  double seconds_per_step = m.step_time_s, tokens_per_s = m.tokens_per_s;
  if (run_steps_ == 2) rate_start_ = begin;
  if (run_steps_ >= 2) {
    run_tokens_ += m.step_tokens;
    const double wall = seconds_between(rate_start_, end);
    seconds_per_step = wall / static_cast<double>(run_steps_ - 1);
    tokens_per_s = wall > 0 ? static_cast<double>(run_tokens_) / wall : 0.0;
  }
  EtaInputs eta;
  eta.step = progress_.step;
  eta.max_steps = settings_.max_steps;
  eta.tokens = progress_.tokens;
  eta.max_tokens = settings_.max_tokens;
  eta.elapsed_s = progress_.elapsed_s;
  eta.max_time_s = settings_.max_time_s;
  eta.seconds_per_step = seconds_per_step;
  eta.tokens_per_s = tokens_per_s;
  m.eta_s = estimate_eta(eta);
}

}  // namespace tessera::core
