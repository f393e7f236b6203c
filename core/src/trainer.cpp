#include "tessera/core/trainer.hpp"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>

#include <cmath>
#include <csignal>

#include "tessera/communicator.hpp"
#include "tessera/core/stop_signal.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/parallel.hpp"

namespace tessera::core {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The L2 norm over all gradients as a device tensor (no host synchronisation).
at::Tensor global_grad_norm(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return at::zeros({}, at::kFloat);
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  for (auto& n : norms) n = n.to(at::kFloat);
  return at::stack(norms).norm();
}

std::vector<at::Tensor> present_grads(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

std::int64_t bytes_of(const StateDict& state) {
  std::int64_t n = 0;
  for (const auto& [key, t] : state) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

}  // namespace

Trainer::Trainer(TrainerParts parts, TrainerSettings settings, RunContext context)
    : parts_(std::move(parts)),
      settings_(settings),
      context_(std::move(context)),
      device_(context_.device) {
  if (!parts_.model || !parts_.train_data || !parts_.loss || !parts_.optimizer) {
    throw Error("trainer: model, train_data, loss and optimizer are all required");
  }
  if (!context_.communicator) throw Error("trainer: the run context has no communicator");
  parts_.model->to(device_);
  parts_.model->train();
  parameters_ = parts_.optimizer->parameters();
  if (parts_.parallel) {
    parts_.parallel->setup(*parts_.model, *parts_.optimizer, *context_.communicator);
  } else if (context_.world_size > 1) {
    throw Error("trainer: a run of " + std::to_string(context_.world_size) +
                " ranks needs a parallel strategy (components.parallel)");
  }
  parts_.train_data->set_shard(context_.rank, context_.world_size);
  progress_.max_steps = settings_.max_steps;
}

MemoryReport Trainer::measure_memory() const {
  MemoryReport report;
  if (parts_.parallel) {
    const ParallelMemory held = parts_.parallel->memory();
    report.parameters = held.parameters;
    report.gradients = held.gradients;
  } else {
    for (const auto& p : parameters_) {
      report.parameters += static_cast<std::int64_t>(p.nbytes());
      if (p.grad().defined()) report.gradients += static_cast<std::int64_t>(p.grad().nbytes());
    }
  }
  report.optimizer_state = bytes_of(parts_.optimizer->state_dict());
  return report;
}

double Trainer::elapsed_s() const { return seconds_between(started_, Clock::now()); }

CallbackContext Trainer::callback_context() {
  return CallbackContext{context_, progress_, *parts_.model, control_};
}

std::string Trainer::stop_reason() const {
  if (settings_.max_steps > 0 && progress_.step >= settings_.max_steps) {
    return "reached max_steps " + std::to_string(settings_.max_steps);
  }
  if (settings_.max_tokens > 0 && progress_.tokens >= settings_.max_tokens) {
    return "reached max_tokens " + std::to_string(settings_.max_tokens);
  }
  if (settings_.max_time_s > 0 && progress_.elapsed_s >= settings_.max_time_s) {
    return "reached max_time_s " + std::to_string(settings_.max_time_s);
  }
  if (int sig = stop_signal_received()) {
    return std::string("received ") + (sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal");
  }
  if (control_.stop_requested()) return "callback asked to stop: " + control_.stop_reason();
  return {};
}

std::string Trainer::agreed_stop_reason() {
  std::string reason = stop_reason();
  Communicator& comm = *context_.communicator;
  if (comm.world_size() == 1) return reason;
  // A signal, a callback or the clock may stop one rank before the others; every rank must stop
  // after the same step, or the others would wait in a collective for it.
  at::Tensor stop = at::tensor({static_cast<std::int64_t>(reason.empty() ? 0 : 1)}, at::kLong);
  comm.all_reduce(stop, ReduceOp::max);
  if (reason.empty() && stop.item<std::int64_t>() != 0) reason = "another rank stopped";
  return reason;
}

TrainResult Trainer::fit() {
  started_ = Clock::now();
  auto ctx = callback_context();
  TrainResult result;
  try {
    for (auto& cb : parts_.callbacks) cb->on_train_begin(ctx);
    while ((result.stop_reason = agreed_stop_reason()).empty()) {
      StepMetrics metrics = step();
      if (metrics.step == 1) result.first_loss = metrics.loss;
      result.last_loss = metrics.loss;
      for (auto& cb : parts_.callbacks) cb->on_step_end(ctx, metrics);
      if (control_.save_requested()) {
        // Nothing in this loop writes checkpoints yet; say so rather than drop the request silently.
        log::warn("a callback asked for a checkpoint at step ", progress_.step,
                  ", but this trainer has no checkpoint writer; nothing was saved");
        control_.clear_save();
      }
    }
    log::info("stopping after step ", progress_.step, ": ", result.stop_reason);
    for (auto& cb : parts_.callbacks) cb->on_train_end(ctx);
  } catch (const std::exception& e) {
    for (auto& cb : parts_.callbacks) {
      try {
        cb->on_exception(ctx, e.what());
      } catch (const std::exception& nested) {
        log::error("a callback failed while handling an error: ", nested.what());
      }
    }
    throw;
  }
  result.steps = progress_.step;
  result.tokens = progress_.tokens;
  result.elapsed_s = progress_.elapsed_s;
  return result;
}

StepMetrics Trainer::step() {
  if (progress_.step == 0 && started_ == Clock::time_point{}) started_ = Clock::now();
  const auto t_begin = Clock::now();
  auto ctx = callback_context();
  for (auto& cb : parts_.callbacks) cb->on_step_begin(ctx);

  // All micro-batches are drawn first: the loss divisor is the target-token count of the whole
  // step, known on the host before any forward pass.
  std::vector<Batch> batches;
  batches.reserve(static_cast<size_t>(settings_.grad_accum));
  std::int64_t target_tokens = 0, input_tokens = 0;
  for (std::int64_t i = 0; i < settings_.grad_accum; ++i) {
    batches.push_back(parts_.train_data->next_batch(settings_.micro_batch_size));
    target_tokens += batches.back().num_target_tokens;
    input_tokens += batches.back().input_ids.numel();
  }
  Communicator& comm = *context_.communicator;
  if (comm.world_size() > 1) {
    // The loss divisor is the target-token count of the step over all ranks. Counted on the host,
    // so no device synchronisation (an NCCL group stages the two numbers through the device).
    at::Tensor counts = at::tensor({target_tokens, input_tokens}, at::kLong);
    comm.all_reduce(counts);
    target_tokens = counts[0].item<std::int64_t>();
    input_tokens = counts[1].item<std::int64_t>();
  }
  const auto t_data = Clock::now();

  // Dividing every micro-batch's summed loss by the step's token count makes the accumulated
  // gradient exactly that of one big batch, however unevenly tokens fall across micro-batches.
  const double inv_tokens = 1.0 / static_cast<double>(std::max<std::int64_t>(target_tokens, 1));
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  for (std::size_t i = 0; i < batches.size(); ++i) {
    Batch& batch = batches[i];
    if (parts_.parallel) parts_.parallel->begin_micro_batch(static_cast<std::int64_t>(i), settings_.grad_accum);
    at::Tensor inputs = batch.input_ids.to(device_, /*non_blocking=*/true);
    at::Tensor labels = batch.labels.to(device_, /*non_blocking=*/true);
    at::Tensor logits = parts_.model->forward(inputs);
    LossSum loss = parts_.loss->compute(logits, labels);
    (loss.sum * inv_tokens).backward();
    loss_sum += loss.sum.detach();
  }
  batches.clear();
  const auto t_backward = Clock::now();

  std::vector<at::Tensor> grads;
  at::Tensor grad_norm;
  if (parts_.parallel) {
    parts_.parallel->finish_gradients();
    grads = parts_.parallel->gradients();
    // The loss and the squared norm summed over ranks in one collective (a no-op for one rank).
    at::Tensor sums = at::stack({loss_sum, parts_.parallel->grad_norm_squared_share().to(loss_sum.device(), at::kFloat)});
    comm.all_reduce(sums);
    loss_sum = sums[0];
    grad_norm = sums[1].sqrt();
  } else {
    grads = present_grads(parameters_);
    grad_norm = global_grad_norm(grads);
  }
  for (auto& cb : parts_.callbacks) cb->on_before_optimizer_step(ctx, grad_norm);

  const double lr = parts_.optimizer->base_lr() *
                    (parts_.scheduler ? parts_.scheduler->lr_factor(progress_.step) : 1.0);
  const bool skipped = control_.skip_requested();
  control_.clear_skip();
  if (!skipped) {
    if (settings_.clip_grad_norm > 0 && !grads.empty()) {
      at::Tensor coef = (settings_.clip_grad_norm / (grad_norm + 1e-6)).clamp_max(1.0);
      at::_foreach_mul_(grads, coef.to(grads.front().scalar_type()));
    }
    parts_.optimizer->set_lr(lr);
    if (parts_.parallel) {
      parts_.parallel->optimizer_step(*parts_.optimizer);
    } else {
      parts_.optimizer->step();
    }
  }
  if (parts_.parallel) {
    parts_.parallel->zero_grad(*parts_.optimizer);
  } else {
    parts_.optimizer->zero_grad();
  }
  const auto t_optimizer = Clock::now();

  progress_.step += 1;
  progress_.tokens += input_tokens;

  StepMetrics m;
  m.step = progress_.step;
  // The one host synchronisation of the step: the values the sinks log, in one copy.
  const at::Tensor logged =
      at::stack({loss_sum * inv_tokens, grad_norm.to(loss_sum.device())}).to(at::kCPU, at::kDouble);
  m.loss = logged[0].item<double>();
  m.grad_norm = logged[1].item<double>();
  const auto t_end = Clock::now();
  m.lr = lr;
  m.tokens = progress_.tokens;
  m.step_tokens = input_tokens;
  m.target_tokens = target_tokens;
  m.step_time_s = seconds_between(t_begin, t_end);
  m.tokens_per_s = m.step_time_s > 0 ? static_cast<double>(input_tokens) / m.step_time_s : 0.0;
  progress_.elapsed_s = elapsed_s();
  m.elapsed_s = progress_.elapsed_s;
  m.skipped = skipped;
  m.extra["time_data_s"] = seconds_between(t_begin, t_data);
  m.extra["time_forward_backward_s"] = seconds_between(t_data, t_backward);
  m.extra["time_optimizer_s"] = seconds_between(t_backward, t_optimizer);
  // Optimizer state exists from the first update on (LibTorch optimizers create it lazily).
  if (progress_.step == 1) {
    memory_ = measure_memory();
    log::info("memory held by rank ", context_.rank, " between steps: parameters ", memory_.parameters,
              " B, gradients ", memory_.gradients, " B, optimizer state ", memory_.optimizer_state, " B, total ",
              memory_.total(), " B");
  }
  return m;
}

}  // namespace tessera::core
