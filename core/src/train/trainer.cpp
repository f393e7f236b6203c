// The trainer's construction and its loop: agreeing on stops and saves at each step boundary,
// the events around the steps, and saving. One step is trainer_step.cpp.
// Long (past 400 lines) because construction, the loop and saving share the trainer's private
// state; splitting them would pass that state around rather than separate concepts.
#include "tessera/core/train/trainer.hpp"
#include "../schedule/step_schedule.hpp"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <csignal>
#include <utility>

#include "tessera/run/communicator.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/core/process/stop_signal.hpp"
#include "tessera/core/train/local_strategy.hpp"
#include "tessera/core/train/prefetching_dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/run/human_format.hpp"
#include "tessera/log.hpp"
#include "tessera/run/precision.hpp"

namespace tessera::core {
namespace {

using Clock = std::chrono::steady_clock;

// Eager steps before trainer.cuda_graph captures: the first creates the gradients and the
// optimizer state, the second runs as every later step will (PyTorch's own advice is a few).
constexpr std::int64_t kCudaGraphWarmupSteps = 2;

// The precision the model's matrix products run in, which decides the peak MFU is measured
// against: autocast's (settings.precision), else the parameters' dtype, and for fp32 on a GPU
// whether cuBLAS may use TF32.
ComputePrecision compute_precision(const std::string& precision, const std::vector<at::Tensor>& parameters,
                                   const c10::Device& device) {
  if (compute_dtype(precision) == at::kBFloat16) return ComputePrecision::bf16;
  const auto dtype = parameters.empty() ? at::kFloat : parameters.front().scalar_type();
  if (dtype == at::kBFloat16) return ComputePrecision::bf16;
  if (dtype == at::kHalf) return ComputePrecision::fp16;
  if (device.is_cuda() && at::globalContext().allowTF32CuBLAS()) return ComputePrecision::tf32;
  return ComputePrecision::fp32;
}

// A run that names no strategy is a run of one rank: it gets the local one.
TrainerParts with_strategy(TrainerParts parts) {
  if (!parts.parallel) parts.parallel = make_local_strategy();
  return parts;
}

}  // namespace

Trainer::Trainer(TrainerParts parts, TrainerSettings settings, RunContext context, double peak_flops)
    : parts_(with_strategy(std::move(parts))),
      settings_(settings),
      context_(std::move(context)),
      device_(context_.device),
      compute_dtype_(compute_dtype(context_.precision)),
      strategy_(*parts_.parallel) {
  if (!context_.communicator) throw Error("trainer: the run context has no communicator");
  mesh_ = context_.mesh ? context_.mesh : DeviceMesh::data_parallel_only(context_.communicator);
  if (!parts_.model || !parts_.train_data || !parts_.loss || !parts_.optimizer) {
    throw Error("trainer: model, train_data, loss and optimizer are all required");
  }
  const ParallelDims& dims = mesh_->dims();
  placements_ = Placements(context_, parts_.model->tensor_parallel_plan(), parts_.model->pipeline_tied_parameters());
  schedule_ = StepSchedule::for_mesh(*this);
  // A vocabulary split over tensor-parallel ranks goes to the loss as hidden states and the head:
  // whole logits would be gathered otherwise. So does what the schedule's loss sees of a model
  // (a slice of each sequence, a last stage).
  hidden_loss_ = parts_.loss->takes_hidden_states() || schedule_->loss_from_hidden_states() ||
                 (parts_.model->has_output_head() && parts_.model->output_head().vocab_parallel());
  needs_reference_ = parts_.loss->needs_reference();
  // With adapters the reference is the base with them switched off; without, a frozen copy of
  // the starting weights that the parallel strategy holds as it holds the parameters.
  keeps_reference_copy_ = needs_reference_ && parts_.adapters.empty();
  vocab_size_ = parts_.model->vocab_size();
  if (hidden_loss_ && !parts_.model->has_output_head()) {
    throw Error("trainer: the loss computes logits chunk by chunk (chunk_size) but the model does not expose its "
                "hidden states and output head; set the loss's chunk_size to 0");
  }
  if (dims.tp > 1 && placements_.plan().empty()) {
    throw Error("trainer: parallelism.tp is " + std::to_string(dims.tp) + " but " + parts_.names.model +
                " does not split its layers (Model::tensor_parallel_plan); set parallelism.tp: 1");
  }
  place_model(*parts_.model, device_, /*keep_deferred=*/strategy_.materializes_parameters());
  parts_.model->train();
  strategy_.setup(*parts_.model, *parts_.optimizer, mesh_->gradient_group());
  optimizer_placements_ = place_optimizer_parameters();
  parts_.optimizer->set_placements(optimizer_placements_);
  // Each element counts once in the global norm: a parameter every tensor-parallel rank holds
  // whole on its first, a pipeline's tied embedding on its first stage (Placement::counted).
  std::vector<bool> counted;
  for (std::size_t i = 0; i < optimizer_placements_->size(); ++i) {
    counted.push_back((*optimizer_placements_)[i].placement.counted());
  }
  if (std::find(counted.begin(), counted.end(), false) != counted.end()) strategy_.count_in_grad_norm(counted);
  if (parts_.model->has_deferred_parameters()) {
    throw Error("trainer: parallel strategy set up without giving the model's deferred parameters storage");
  }
  if (settings_.cuda_graph) {
    if (!is_local_strategy(strategy_) || !schedule_->capturable()) {
      throw Error("trainer.cuda_graph: captures the step of a single process without a parallel strategy; set "
                  "trainer.cuda_graph: false");
    }
    if (needs_reference_) {
      throw Error("trainer.cuda_graph: " + parts_.names.loss + " runs a reference forward each micro-batch, which "
                  "the captured step does not hold; set trainer.cuda_graph: false");
    }
    graph_ = std::make_unique<MicroBatchGraph>(device_, kCudaGraphWarmupSteps);
  }
  rollout_settings_ = parts_.loss->rollouts();
  if (rollout_settings_) check_rollout_setup();
  if (settings_.prefetch > 0 && !rollout_settings_) {  // prompts are not drawn ahead
    parts_.train_data =
        std::make_shared<PrefetchingDataset>(parts_.train_data, settings_.prefetch, /*pin_memory=*/device_.is_cuda());
  }
  // Tensor-parallel peers read the same batches: the data is split over the data-parallel ranks.
  parts_.train_data->set_shard(mesh_->data_parallel().rank(), mesh_->data_parallel().world_size());
  progress_.max_steps = settings_.max_steps;
  count_parameters();
  peak_ = resolve_peak_flops(peak_flops, device_name(device_),
                             compute_precision(context_.precision, parts_.optimizer->parameters(), device_));
  if (context_.rank == 0) {
    if (compute_dtype_ == at::kBFloat16 && device_.is_cpu() && !cpu_has_fast_bf16_matmul()) {
      log::warn("settings.precision: bf16 on a CPU without AVX-512: LibTorch multiplies bfloat16 matrices here in a "
                "generic loop, about twenty times slower than fp32; use fp32 for speed on this CPU");
    }
    if (peak_.flops) {
      log::info("MFU is measured against ", *peak_.flops / 1e12, " TFLOP/s per device (", peak_.source, ")");
    } else {
      log::info("MFU is not reported: ", peak_.source);
    }
  }
}

Trainer::~Trainer() = default;

// The model onto the run's device. Deferred parameters (tessera/nn/deferred_init.hpp) get storage
// there and their initial values, all at once, unless the strategy does it a unit at a time.
void place_model(Model& model, const c10::Device& device, bool keep_deferred) {
  if (!model.has_deferred_parameters()) {
    model.to(device);
    return;
  }
  c10::NoGradGuard no_grad;
  for (auto& buffer : model.buffers()) buffer.set_data(buffer.to(device));
  // Parameters made with storage beside the deferred ones (an adapter's) go to the device as well.
  for (auto& p : model.parameters()) {
    if (!p.is_meta() && p.device() != device) p.set_data(p.to(device));
  }
  if (keep_deferred) return;
  std::vector<at::Tensor> deferred;
  for (const auto& p : model.parameters()) {
    if (!p.is_meta()) continue;
    materialize_parameter(p, at::empty(p.sizes(), p.options().device(device)));
    deferred.push_back(p);
  }
  model.initialize_parameters(deferred);
}

double Trainer::elapsed_s() const {
  return elapsed_before_ + std::chrono::duration<double>(Clock::now() - started_).count();
}

CallbackContext Trainer::callback_context() {
  CallbackContext ctx{context_, progress_, *parts_.model, control_, this};
  // The reference model where the run has one: the base under adapters, or the kept copy.
  if (needs_reference_ || !parts_.adapters.empty()) ctx.reference_logits = reference_forward();
  return ctx;
}

void Trainer::evaluation_end(CallbackContext& ctx, const EvalMetrics& metrics) {
  for_each_callback("on_evaluation_end", progress_.step, [&](Callback& cb) { cb.on_evaluation_end(ctx, metrics); });
}

std::string Trainer::stop_reason() const {
  if (settings_.max_steps > 0 && progress_.step >= settings_.max_steps) {
    return "reached max_steps " + std::to_string(settings_.max_steps);
  }
  if (settings_.max_tokens > 0 && progress_.tokens >= settings_.max_tokens) {
    return "reached max_tokens " + std::to_string(settings_.max_tokens);
  }
  if (settings_.max_epochs > 0 &&
      static_cast<double>(progress_.samples) >=
          settings_.max_epochs * static_cast<double>(parts_.train_data->num_samples())) {
    return "reached the end of the data (max_epochs " + human::format("%g", settings_.max_epochs) + ")";
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

std::string Trainer::agree_on_stop_and_save(bool& save_requested) {
  std::string reason = stop_reason();
  save_requested = control_.save_requested();
  control_.clear_save();
  // A signal, a callback or the clock may stop one rank before the others; every rank must stop
  // after the same step, or the others would wait in a collective for it. Saves likewise.
  // A background save that failed on one rank stops every rank (it would otherwise be reported
  // on that rank alone while the others wait for it in a collective).
  const bool save_failed = checkpointer_ && checkpointer_->failed();
  // A callback's fault at the last step boundary on one rank: all learn it (as rank + 1).
  at::Tensor flags = at::tensor({static_cast<std::int64_t>(reason.empty() ? 0 : 1),
                                 static_cast<std::int64_t>(save_requested ? 1 : 0),
                                 static_cast<std::int64_t>(save_failed ? 1 : 0),
                                 boundary_fault_ ? context_.rank + 1 : std::int64_t{0}}, at::kLong);
  context_.communicator->all_reduce(flags, ReduceOp::max);
  faulted_rank_ = flags[3].item<std::int64_t>() - 1;
  if (save_failed) checkpointer_->wait();  // rethrows this rank's error
  if (flags[2].item<std::int64_t>() != 0) throw Error("a checkpoint save failed on another rank (see its log)");
  if (reason.empty() && flags[0].item<std::int64_t>() != 0) reason = "another rank stopped";
  save_requested = flags[1].item<std::int64_t>() != 0;
  return reason;
}

std::string Trainer::callback_name(std::size_t i) const {
  return i < parts_.names.callbacks.size() ? parts_.names.callbacks[i] : "callback #" + std::to_string(i);
}

// A callback failed on rank faulted_rank_ after a complete step: every rank holds that step's
// state, so every rank writes it as an emergency checkpoint (a collective under fsdp), then fails.
void Trainer::end_after_fault() {
  std::string saved = "this run writes no checkpoints, so nothing was saved";
  if (checkpointer_) {
    if (last_checkpoint_step_ != progress_.step) save(/*checkpoint=*/true, /*export_model=*/false, "emergency");
    wait_for_last_save();
    saved = "an emergency checkpoint of step " + std::to_string(progress_.step) + " was written to " +
            checkpoint_.store.checkpoint(progress_.step).path().string() + " (--resume auto continues from it)";
  }
  const std::string what = boundary_fault_ ? std::string(boundary_fault_->what())
                                           : "rank " + std::to_string(faulted_rank_) + ": a callback failed after step " +
                                                 std::to_string(progress_.step) + " (see that rank's log)";
  throw Error(what + "; " + saved);
}

// trainer.nonfinite decided (on every rank alike) that the run cannot go on: the weights and
// optimizer state are those before the non-finite steps, so they are saved before the error.
void Trainer::end_after_nonfinite_steps() {
  if (checkpointer_ && last_checkpoint_step_ != progress_.step) {
    save(/*checkpoint=*/true, /*export_model=*/false, "the last good state before the non-finite steps");
  }
  wait_for_last_save();
  throw Error(nonfinite_failure_);
}

TrainResult Trainer::fit() {
  in_fit_ = true;
  started_ = Clock::now();
  auto ctx = callback_context();
  TrainResult result;
  try {
    for_each_callback("on_train_begin", progress_.step, [&](Callback& cb) { cb.on_train_begin(ctx); });
    if (!restored_from_.empty()) {
      const CheckpointEvent loaded{progress_.step, restored_from_};
      for_each_callback("on_checkpoint_loaded", progress_.step, [&](Callback& cb) { cb.on_checkpoint_loaded(ctx, loaded); });
    }
    // Read after the loop: reading them per step would wait for the device every step.
    MetricValue first_loss, last_loss;
    bool first = true;
    while (true) {
      bool save_requested = false;
      result.stop_reason = agree_on_stop_and_save(save_requested);
      // The last step's non-finite flag, if left to travel, is judged before the run ends.
      if (!result.stop_reason.empty()) settle_pending_nonfinite();
      save_if_due(!result.stop_reason.empty(), save_requested);
      announce_saved_checkpoints(ctx);
      if (faulted_rank_ >= 0) end_after_fault();
      if (!nonfinite_failure_.empty()) end_after_nonfinite_steps();
      if (!result.stop_reason.empty()) break;
      in_step_ = true;
      StepMetrics metrics = step();
      in_step_ = false;
      if (first) first_loss = metrics.loss;
      first = false;
      last_loss = metrics.loss;
      for_each_callback_at_step_boundary("on_step_end", [&](Callback& cb) { cb.on_step_end(ctx, metrics); });
    }
    result.first_loss = first_loss;
    result.last_loss = last_loss;
    log::info("stopping after step ", progress_.step, ": ", result.stop_reason);
    schedule_->log_summary();
    wait_for_last_save();
    announce_saved_checkpoints(ctx);
    for_each_callback("on_train_end", progress_.step, [&](Callback& cb) { cb.on_train_end(ctx); });
  } catch (const std::exception& e) {
    // A step that failed before its decision leaves the previous step's flag unjudged: it is
    // logged if it has landed (waiting on a failed device could hang, and asking a device in a
    // sticky error state throws: that must not replace the error being handled).
    try {
      if (pending_nonfinite_ && pending_nonfinite_->values->ready()) settle_pending_nonfinite();
    } catch (const std::exception& nested) {
      log::error("the last step's non-finite flag could not be read: ", nested.what());
    }
    for (auto& cb : parts_.callbacks) {
      try {
        cb->on_exception(ctx, e.what());
      } catch (const std::exception& nested) {
        log::error("a callback failed while handling an error: ", nested.what());
      }
    }
    in_fit_ = false;
    const bool mid_step = std::exchange(in_step_, false);
    // A component failing inside a step leaves the step half done (and the other ranks inside its
    // collectives): nothing consistent is left to save.
    if (mid_step && dynamic_cast<const ComponentFault*>(&e)) {
      throw Error(std::string(e.what()) + "; the step was cut short, so no emergency checkpoint was written (--resume "
                                          "auto continues from the last checkpoint)");
    }
    throw;
  }
  in_fit_ = false;
  result.steps = progress_.step;
  result.tokens = progress_.tokens;
  result.elapsed_s = progress_.elapsed_s;
  return result;
}

}  // namespace tessera::core
