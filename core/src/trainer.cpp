#include "tessera/core/trainer.hpp"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/Context.h>
#include <c10/core/ScalarType.h>
#include <c10/core/GradMode.h>
#include <c10/core/Device.h>

#include <cmath>
#include <filesystem>
#include <csignal>

#include "tessera/communicator.hpp"
#include "tessera/core/failpoint.hpp"
#include "tessera/core/stop_signal.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/memory_stats.hpp"
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

// The precision the model's matrix products run in, which decides the peak MFU is measured
// against: the parameters' dtype, and for fp32 on a GPU whether cuBLAS may use TF32.
ComputePrecision compute_precision(const std::vector<at::Tensor>& parameters, const c10::Device& device) {
  const auto dtype = parameters.empty() ? at::kFloat : parameters.front().scalar_type();
  if (dtype == at::kBFloat16) return ComputePrecision::bf16;
  if (dtype == at::kHalf) return ComputePrecision::fp16;
  if (device.is_cuda() && at::globalContext().allowTF32CuBLAS()) return ComputePrecision::tf32;
  return ComputePrecision::fp32;
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
  peak_ = resolve_peak_flops(settings_.peak_flops, device_name(device_), compute_precision(parameters_, device_));
  if (context_.rank == 0) {
    if (peak_.flops) {
      log::info("MFU is measured against ", *peak_.flops / 1e12, " TFLOP/s per device (", peak_.source, ")");
    } else {
      log::info("MFU is not reported: ", peak_.source);
    }
  }
}

Trainer::~Trainer() = default;

void Trainer::enable_checkpoints(CheckpointContext context) {
  checkpoint_ = std::move(context);
  // Leftovers of saves a crash interrupted; rank 0 alone, before any rank can start a save.
  if (context_.rank == 0) remove_incomplete_checkpoints(checkpoint_.settings.dir);
  checkpointer_ = std::make_unique<Checkpointer>(checkpoint_.settings, checkpoint_.exports_dir, checkpoint_.timeout);
}

namespace {

StateDict host_copies(const StateDict& state) {
  StateDict out;
  for (const auto& [key, t] : state) out[key] = t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  return out;
}

// A Stateful's state_dict() is already a copy (tessera/stateful.hpp): only device tensors move.
StateDict on_host(StateDict state) {
  for (auto& [key, t] : state) t = t.detach().to(at::kCPU);
  return state;
}

}  // namespace

CheckpointState Trainer::capture() {
  CheckpointState st;
  st.step = progress_.step;
  st.tokens = progress_.tokens;
  st.samples = progress_.samples;
  st.elapsed_s = elapsed_s();
  st.rank = context_.rank;
  st.world_size = context_.world_size;
  st.strategy = checkpoint_.strategy;
  Model& model = *parts_.model;
  // The whole model: gathered by the strategy (a collective under fsdp), kept by rank 0.
  StateDict whole = parts_.parallel ? parts_.parallel->full_parameters(model, /*only_rank=*/0) : StateDict{};
  if (context_.rank == 0) {
    if (parts_.parallel) {
      st.model = std::move(whole);  // host copies already
    } else {
      for (const auto& item : model.named_parameters()) st.model[item.key()] = item.value();
      st.model = host_copies(st.model);
    }
    for (const auto& item : model.named_buffers()) st.model[item.key()] = item.value().detach().to(at::kCPU, false, true);
    st.config_yaml = checkpoint_.config_yaml;
    st.model_config_json = checkpoint_.model_config_json;
  }
  whole.clear();
  st.optimizer_sharded = parts_.parallel && parts_.parallel->shards_optimizer_state();
  st.write_optimizer = st.optimizer_sharded || context_.rank == 0;
  if (st.write_optimizer) {
    st.optimizer = on_host(parts_.optimizer->state_dict());
    const auto params = parts_.optimizer->parameters();
    const auto ranges = parts_.parallel ? parts_.parallel->owned_ranges()
                                        : std::vector<std::pair<std::int64_t, std::int64_t>>{};
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto [begin, end] = ranges.empty() ? std::make_pair(std::int64_t{0}, params[i].numel()) : ranges[i];
      st.optimizer_ranges["param." + std::to_string(i)] = at::tensor({begin, end, params[i].numel()}, at::kLong);
    }
  }
  st.data = on_host(parts_.train_data->state_dict());
  st.rng["cpu"] = at::globalContext().defaultGenerator(c10::Device(c10::kCPU)).get_state();
  if (device_.is_cuda()) st.rng["cuda"] = at::globalContext().defaultGenerator(device_).get_state();
  return st;
}

void Trainer::save(bool checkpoint, bool export_model, const char* why) {
  const auto start = Clock::now();
  auto state = std::make_shared<const CheckpointState>(capture());
  checkpointer_->save(state, checkpoint, export_model);
  pause_s_ = seconds_between(start, Clock::now());
  if (checkpoint) last_checkpoint_step_ = progress_.step;
  if (export_model) last_export_step_ = progress_.step;
  const char* what = checkpoint && export_model ? "checkpoint and model export" : checkpoint ? "checkpoint" : "model export";
  log::info(what, " at step ", progress_.step, " (", why, "): state copied in ", pause_s_ * 1000, " ms",
            checkpointer_->settings().async ? "; writing in the background" : "");
}

void Trainer::restore(const std::string& checkpoint_path) {
  LoadedCheckpoint ck = read_checkpoint(checkpoint_path, context_.rank);
  Model& model = *parts_.model;
  c10::NoGradGuard no_grad;
  if (parts_.parallel) {
    parts_.parallel->load_full_parameters(model, ck.model);
  } else {
    for (auto& item : model.named_parameters()) {
      auto it = ck.model.find(item.key());
      if (it == ck.model.end()) throw CheckpointError("checkpoint " + checkpoint_path + " has no parameter " + item.key());
      if (it->second.sizes() != item.value().sizes()) {
        throw CheckpointError("checkpoint " + checkpoint_path + ": " + item.key() + " has shape " +
                              c10::str(it->second.sizes()) + ", the model's has " + c10::str(item.value().sizes()));
      }
      item.value().copy_(it->second);
    }
  }
  for (auto& item : model.named_buffers()) {
    auto it = ck.model.find(item.key());
    if (it != ck.model.end()) item.value().copy_(it->second);
  }
  const auto params = parts_.optimizer->parameters();
  if (parts_.parallel && parts_.parallel->shards_optimizer_state()) {
    const auto ranges = parts_.parallel->owned_ranges();
    StateDict mine = optimizer_state_for(ck.optimizer, params, &ranges);
    parts_.parallel->with_owned_parameters([&] { parts_.optimizer->load_state_dict(mine); });
  } else {
    parts_.optimizer->load_state_dict(optimizer_state_for(ck.optimizer, params, nullptr));
  }
  parts_.train_data->load_state_dict(ck.data);
  // A Generator is a handle: setting the copy's state sets the global generator's.
  if (ck.rng.count("cpu")) {
    at::Generator cpu = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
    cpu.set_state(ck.rng.at("cpu"));
  }
  if (ck.rng.count("cuda") && device_.is_cuda()) {
    at::Generator cuda = at::globalContext().defaultGenerator(device_);
    cuda.set_state(ck.rng.at("cuda"));
  }
  progress_.step = ck.metadata.step;
  progress_.tokens = ck.metadata.tokens;
  progress_.samples = ck.metadata.samples;
  progress_.elapsed_s = elapsed_before_ = ck.metadata.elapsed_s;
  last_checkpoint_step_ = ck.metadata.step;
  restored_from_ = checkpoint_path;
  if (context_.rank == 0 && checkpointer_) supersede_checkpoints_after(checkpoint_.settings.dir, ck.metadata.step);
  log::info("resumed from ", checkpoint_path, " at step ", ck.metadata.step, " (saved by ", ck.metadata.world_size,
            ck.metadata.world_size == 1 ? " rank" : " ranks", " with ", ck.metadata.strategy, "; now ",
            context_.world_size, context_.world_size == 1 ? " rank" : " ranks", ")");
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

double Trainer::elapsed_s() const { return elapsed_before_ + seconds_between(started_, Clock::now()); }

CallbackContext Trainer::callback_context() {
  return CallbackContext{context_, progress_, *parts_.model, control_, this};
}

void Trainer::evaluation_end(CallbackContext& ctx, const EvalMetrics& metrics) {
  for (auto& cb : parts_.callbacks) cb->on_evaluation_end(ctx, metrics);
}

void Trainer::announce_saved_checkpoints(CallbackContext& ctx) {
  if (!checkpointer_) return;
  for (const std::int64_t step : checkpointer_->take_completed()) {
    const CheckpointEvent event{step, (std::filesystem::path(checkpoint_.settings.dir) / checkpoint_name(step)).string()};
    for (auto& cb : parts_.callbacks) cb->on_checkpoint_saved(ctx, event);
  }
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

void Trainer::wait_for_last_save() {
  if (!checkpointer_) return;
  std::exception_ptr failure;
  try {
    checkpointer_->wait();
  } catch (...) {
    failure = std::current_exception();
  }
  // Every rank learns whether the last save failed anywhere, so none goes on into on_train_end
  // (where callbacks may run collectives) while another has failed.
  if (context_.communicator->world_size() > 1) {
    at::Tensor failed = at::tensor({static_cast<std::int64_t>(failure ? 1 : 0)}, at::kLong);
    context_.communicator->all_reduce(failed, ReduceOp::max);
    if (!failure && failed.item<std::int64_t>() != 0) throw Error("the last checkpoint save failed on another rank (see its log)");
  }
  if (failure) std::rethrow_exception(failure);
}

std::string Trainer::agree_on_stop_and_save(bool& save_requested) {
  std::string reason = stop_reason();
  save_requested = control_.save_requested();
  control_.clear_save();
  Communicator& comm = *context_.communicator;
  if (comm.world_size() == 1) {
    if (checkpointer_ && checkpointer_->failed()) checkpointer_->wait();  // rethrows
    return reason;
  }
  // A signal, a callback or the clock may stop one rank before the others; every rank must stop
  // after the same step, or the others would wait in a collective for it. Saves likewise.
  // A background save that failed on one rank stops every rank (it would otherwise be reported
  // on that rank alone while the others wait for it in a collective).
  const bool save_failed = checkpointer_ && checkpointer_->failed();
  at::Tensor flags = at::tensor({static_cast<std::int64_t>(reason.empty() ? 0 : 1),
                                 static_cast<std::int64_t>(save_requested ? 1 : 0),
                                 static_cast<std::int64_t>(save_failed ? 1 : 0)}, at::kLong);
  comm.all_reduce(flags, ReduceOp::max);
  if (save_failed) checkpointer_->wait();  // rethrows this rank's error
  if (flags[2].item<std::int64_t>() != 0) throw Error("a checkpoint save failed on another rank (see its log)");
  if (reason.empty() && flags[0].item<std::int64_t>() != 0) reason = "another rank stopped";
  save_requested = flags[1].item<std::int64_t>() != 0;
  return reason;
}

TrainResult Trainer::fit() {
  started_ = Clock::now();
  auto ctx = callback_context();
  TrainResult result;
  const auto& ck = checkpoint_.settings;
  try {
    for (auto& cb : parts_.callbacks) cb->on_train_begin(ctx);
    if (!restored_from_.empty()) {
      const CheckpointEvent loaded{progress_.step, restored_from_};
      for (auto& cb : parts_.callbacks) cb->on_checkpoint_loaded(ctx, loaded);
    }
    bool first = true;
    while (true) {
      bool save_requested = false;
      result.stop_reason = agree_on_stop_and_save(save_requested);
      const std::int64_t done = progress_.step;
      if (save_requested && !checkpointer_) {
        log::warn("a callback asked for a checkpoint at step ", done, ", but this trainer has no checkpoint writer");
      }
      if (checkpointer_ && done > 0) {
        const bool periodic = ck.every_steps > 0 && done % ck.every_steps == 0;
        const bool final = !result.stop_reason.empty() && ck.at_end;
        const bool save_now = (periodic || final || save_requested) && last_checkpoint_step_ != done;
        const bool export_now = ((ck.export_every_steps > 0 && done % ck.export_every_steps == 0) ||
                                 (!result.stop_reason.empty() && ck.export_at_end)) &&
                                last_export_step_ != done;
        if (save_now || export_now) {
          save(save_now, export_now, save_requested ? "a callback asked" : final ? "end of training" : "periodic");
        }
      }
      announce_saved_checkpoints(ctx);
      if (!result.stop_reason.empty()) break;
      StepMetrics metrics = step();
      if (first) result.first_loss = metrics.loss;
      first = false;
      result.last_loss = metrics.loss;
      for (auto& cb : parts_.callbacks) cb->on_step_end(ctx, metrics);
    }
    log::info("stopping after step ", progress_.step, ": ", result.stop_reason);
    wait_for_last_save();
    announce_saved_checkpoints(ctx);
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
  Communicator& comm = *context_.communicator;
  const double waited_before = comm.wait_seconds();
  if (control_.skip_requested()) {
    // Asked after the last optimizer step (on_collect_metrics, on_step_end, an evaluation):
    // skipping a later, healthy step instead would be wrong.
    log::warn("a skip requested after step ", progress_.step, "'s optimizer step is dropped; "
              "request skips up to on_before_optimizer_step");
    control_.clear_skip();
  }
  auto ctx = callback_context();
  for (auto& cb : parts_.callbacks) cb->on_step_begin(ctx);
  failpoint("trainer.step");

  // All micro-batches are drawn first: the loss divisor is the target-token count of the whole
  // step, known on the host before any forward pass.
  std::vector<Batch> batches;
  batches.reserve(static_cast<size_t>(settings_.grad_accum));
  std::int64_t target_tokens = 0, input_tokens = 0, samples = 0, seq_len = 0;
  for (std::int64_t i = 0; i < settings_.grad_accum; ++i) {
    batches.push_back(parts_.train_data->next_batch(settings_.micro_batch_size));
    target_tokens += batches.back().num_target_tokens;
    input_tokens += batches.back().input_ids.numel();
    samples += batches.back().input_ids.size(0);
    seq_len = std::max<std::int64_t>(seq_len, batches.back().input_ids.size(-1));
  }
  if (comm.world_size() > 1) {
    // The loss divisor is the target-token count of the step over all ranks. Counted on the host,
    // so no device synchronisation (an NCCL group stages the two numbers through the device).
    at::Tensor counts = at::tensor({target_tokens, input_tokens, samples}, at::kLong);
    comm.all_reduce(counts);
    target_tokens = counts[0].item<std::int64_t>();
    input_tokens = counts[1].item<std::int64_t>();
    samples = counts[2].item<std::int64_t>();
  }
  const auto t_data = Clock::now();

  // Dividing every micro-batch's summed loss by the step's token count makes the accumulated
  // gradient exactly that of one big batch, however unevenly tokens fall across micro-batches.
  const double inv_tokens = 1.0 / static_cast<double>(std::max<std::int64_t>(target_tokens, 1));
  // A model's own loss terms (MoE balancing) are means per forward: each micro-batch of each
  // rank contributes 1/(micro-batches x ranks), so the step optimises their mean.
  const double aux_weight = 1.0 / static_cast<double>(settings_.grad_accum * comm.world_size());
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  for (std::size_t i = 0; i < batches.size(); ++i) {
    Batch& batch = batches[i];
    if (parts_.parallel) parts_.parallel->begin_micro_batch(static_cast<std::int64_t>(i), settings_.grad_accum);
    at::Tensor inputs = batch.input_ids.to(device_, /*non_blocking=*/true);
    at::Tensor labels = batch.labels.to(device_, /*non_blocking=*/true);
    at::Tensor logits = parts_.model->forward(inputs);
    LossSum loss = parts_.loss->compute(logits, labels);
    at::Tensor objective = loss.sum * inv_tokens;
    if (at::Tensor aux = parts_.model->auxiliary_loss(); aux.defined()) objective = objective + aux * aux_weight;
    objective.backward();
    const at::Tensor micro_loss = loss.sum.detach();
    loss_sum += micro_loss;
    if (!parts_.callbacks.empty()) {
      const MicroBatchEnd end{static_cast<std::int64_t>(i), settings_.grad_accum, micro_loss, batch.num_target_tokens};
      for (auto& cb : parts_.callbacks) cb->on_micro_batch_end(ctx, end);
    }
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
  // The step's loss (all ranks), for the callbacks here and the metrics at the end.
  const at::Tensor step_loss = loss_sum * inv_tokens;
  if (!parts_.callbacks.empty()) {
    const BeforeOptimizerStep before{grad_norm, step_loss};
    for (auto& cb : parts_.callbacks) cb->on_before_optimizer_step(ctx, before);
  }

  const double lr = parts_.optimizer->base_lr() *
                    (parts_.scheduler ? parts_.scheduler->lr_factor(progress_.step) : 1.0);
  bool skipped = control_.skip_requested();
  control_.clear_skip();
  if (comm.world_size() > 1) {
    // A skip asked for on one rank skips the step on all: replicas must stay identical, and
    // sharded strategies' optimizer steps are collectives.
    at::Tensor skip = at::tensor({static_cast<std::int64_t>(skipped ? 1 : 0)}, at::kLong);
    comm.all_reduce(skip, ReduceOp::max);
    skipped = skip.item<std::int64_t>() != 0;
  }
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
  progress_.samples += samples;

  StepMetrics m;
  m.step = progress_.step;
  // The one host synchronisation of the step: the values the sinks log, in one copy.
  const at::Tensor logged =
      at::stack({step_loss, grad_norm.to(step_loss.device())}).to(at::kCPU, at::kDouble);
  m.loss = logged[0].item<double>();
  m.grad_norm = logged[1].item<double>();
  const auto t_end = Clock::now();
  m.lr = lr;
  m.tokens = progress_.tokens;
  m.step_tokens = input_tokens;
  m.target_tokens = target_tokens;
  m.step_time_s = seconds_between(t_begin, t_end);
  progress_.elapsed_s = elapsed_s();
  m.elapsed_s = progress_.elapsed_s;
  m.skipped = skipped;
  m.time_data_s = seconds_between(t_begin, t_data);
  m.time_forward_backward_s = seconds_between(t_data, t_backward);
  m.time_optimizer_s = seconds_between(t_backward, t_optimizer);
  m.time_communication_s = comm.wait_seconds() - waited_before;
  const MemoryStats memory = memory_stats(device_);
  m.memory_in_use_bytes = memory.in_use;
  m.memory_peak_bytes = memory.peak;
  m.memory_reserved_bytes = memory.reserved;
  // The next peak window starts here, so it covers what runs between steps (evaluation, samples,
  // checkpoint copies) as well as the next step.
  reset_peak_memory(device_);
  fill_rates(m, seq_len, t_begin, t_end);
  if (pause_s_ > 0) {
    // The copy of the state a save made before this step, while training waited.
    m.extra["time_checkpoint_s"] = pause_s_;
    pause_s_ = 0;
  }
  // Optimizer state exists from the first update on (LibTorch optimizers create it lazily).
  if (progress_.step == 1) {
    memory_ = measure_memory();
    log::info("memory held by rank ", context_.rank, " between steps: parameters ", memory_.parameters,
              " B, gradients ", memory_.gradients, " B, optimizer state ", memory_.optimizer_state, " B, total ",
              memory_.total(), " B");
  }
  for (auto& cb : parts_.callbacks) cb->on_collect_metrics(ctx, m);
  return m;
}

void Trainer::fill_rates(StepMetrics& m, std::int64_t seq_len, Clock::time_point begin, Clock::time_point end) {
  const double devices = static_cast<double>(context_.world_size);
  m.tokens_per_s = m.step_time_s > 0 ? static_cast<double>(m.step_tokens) / m.step_time_s : 0.0;
  m.tokens_per_s_per_device = m.tokens_per_s / devices;
  if (peak_.flops) {
    m.mfu = model_flops_utilisation(parts_.model->flops_per_token(seq_len), m.tokens_per_s_per_device, *peak_.flops);
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
