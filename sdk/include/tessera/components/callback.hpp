// Kind `callback`: code the trainer calls at fixed events of the loop. Callbacks run in the
// order the YAML lists them, may read the model and metrics, add metrics of their own, announce
// evaluation results, and may ask the loop to stop, to skip the optimizer step, or to save.
// The events, their order and what each may do are described in docs/observability.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "tessera/components/loss.hpp"
#include "tessera/run/context.hpp"
#include "tessera/export.hpp"
#include "tessera/run/metric_value.hpp"

namespace tessera {

class Model;

// What happened in one optimizer step. Everything is known on the host except the loss, the
// gradient norm and whether a non-finite step was skipped, which arrive from the device without
// the step waiting for them (tessera/run/metric_value.hpp): read them where needed; a sink that
// reads them every step can read the previous step's, which have landed, and spare the device a
// synchronisation.
struct StepMetrics {
  std::int64_t step = 0;        // optimizer steps done, this one included (1-based)
  MetricValue loss;             // summed loss / target tokens of the whole step
  MetricValue grad_norm;        // global L2 norm before clipping
  double lr = 0;
  std::int64_t tokens = 0;      // input tokens consumed so far, all ranks (cumulative)
  std::int64_t step_tokens = 0; // input tokens in this step, all ranks
  std::int64_t target_tokens = 0;  // tokens with a label in this step: the loss's divisor
  double tokens_per_s = 0;      // this step's input tokens (all ranks) / step time
  double tokens_per_s_per_device = 0;  // tokens_per_s / ranks
  // Model FLOPs utilisation: model FLOPs per token x tokens/s per device / the device's peak
  // FLOP/s. Absent when no peak is known (a CPU without settings.peak_flops, an unknown GPU).
  std::optional<double> mfu;
  double step_time_s = 0;
  // Where the step's time went. Communication is the time this rank waited for collectives to
  // finish (the part not hidden behind computation); it is contained in the other three.
  double time_data_s = 0;              // drawing micro-batches, agreeing on token counts
  double time_forward_backward_s = 0;  // every micro-batch's forward and backward
  double time_optimizer_s = 0;         // gradient reduction, clipping, optimizer step, zeroing
  double time_communication_s = 0;     // waiting for collectives, within the phases above
  // This rank's memory: the CUDA caching allocator on a GPU, the process's resident set on a
  // CPU (tessera/run/memory_stats.hpp). The peak is over this step.
  std::int64_t memory_in_use_bytes = 0;
  std::int64_t memory_peak_bytes = 0;
  std::int64_t memory_reserved_bytes = 0;
  double elapsed_s = 0;
  // Estimated seconds to the nearest of max_steps / max_tokens / max_time_s; absent without one.
  std::optional<double> eta_s;
  // 1 when the optimizer step was not applied: a callback asked, or the loss or the gradient
  // norm was NaN/Inf (trainer.nonfinite); else 0. Where the optimizer skips on the device (fused
  // AdamW) it arrives from the device like the loss: `if (m.skipped)` reads it.
  MetricValue skipped;
  std::map<std::string, double> extra;  // further named metrics, written by every sink
};

// One micro-batch's forward and backward are done.
struct MicroBatchEnd {
  std::int64_t index = 0;          // 0-based, within the step
  std::int64_t count = 0;          // micro-batches per step on this rank
  at::Tensor loss_sum;             // this micro-batch's summed loss (device scalar, detached)
  std::int64_t target_tokens = 0;  // its tokens with a label
};

// Gradients are final (reduced across ranks) and the optimizer has not stepped yet.
struct BeforeOptimizerStep {
  at::Tensor grad_norm;  // global L2 norm before clipping (device scalar)
  at::Tensor loss;       // the step's loss, all ranks (device scalar)
};

// Results of one evaluation, announced by the callback that ran it (ctx.announce_evaluation).
struct EvalMetrics {
  std::int64_t step = 0;   // optimizer steps done when it ran
  std::string name;        // which evaluation ("val"); sinks prefix values with it
  std::map<std::string, double> values;  // e.g. loss, perplexity, tokens, time_s
};

struct CheckpointEvent {
  std::int64_t step = 0;
  std::string path;  // the checkpoint folder
};

// Requests a callback may make; the trainer acts on them at the next safe point.
class TESSERA_API TrainerControl {
 public:
  void request_stop(std::string reason);
  void request_skip_step(std::string reason);
  void request_save(std::string reason);

  bool stop_requested() const { return stop_; }
  bool skip_requested() const { return skip_; }
  bool save_requested() const { return save_; }
  const std::string& stop_reason() const { return stop_reason_; }
  void clear_skip() { skip_ = false; }
  void clear_save() { save_ = false; }

 private:
  bool stop_ = false, skip_ = false, save_ = false;
  std::string stop_reason_;
};

struct TrainProgress {
  std::int64_t step = 0;       // optimizer steps done
  std::int64_t max_steps = 0;  // 0 when unbounded
  std::int64_t tokens = 0;     // input tokens consumed so far, all ranks
  std::int64_t samples = 0;    // sequences consumed so far, all ranks
  double elapsed_s = 0;        // training time, carried across resumes
};

struct CallbackContext;

// Delivers an event raised by one callback to every callback (the trainer implements it).
class TESSERA_API CallbackEvents {
 public:
  virtual ~CallbackEvents();
  virtual void evaluation_end(CallbackContext& ctx, const EvalMetrics& metrics) = 0;
};

struct CallbackContext {
  const RunContext& run;
  const TrainProgress& progress;
  Model& model;
  TrainerControl& control;
  CallbackEvents* events = nullptr;  // null outside a trainer (a callback driven by a test)
  // The run's reference model, for evaluating a loss that compares with one (loss/dpo): the base
  // with the adapters off, or the frozen copy of the starting weights. Empty where the run has
  // none (a training loss without a reference and no adapters).
  ReferenceLogits reference_logits;

  // Calls on_evaluation_end on every callback, in order, the announcing one included.
  void announce_evaluation(const EvalMetrics& metrics) {
    if (events) events->evaluation_end(*this, metrics);
  }
};

class TESSERA_API Callback {
 public:
  static constexpr const char* kKind = "callback";
  virtual ~Callback();

  virtual void on_train_begin(CallbackContext&) {}
  // After on_train_begin, when the run continued from a checkpoint.
  virtual void on_checkpoint_loaded(CallbackContext&, const CheckpointEvent&) {}
  virtual void on_step_begin(CallbackContext&) {}
  virtual void on_micro_batch_end(CallbackContext&, const MicroBatchEnd&) {}
  // Reading the tensors' values synchronises with the device; callbacks that do not need them
  // leave them alone. A skip requested here skips this step's update on every rank.
  virtual void on_before_optimizer_step(CallbackContext&, const BeforeOptimizerStep&) {}
  // Called on every callback, on every rank, before any on_step_end sees the step: add named
  // values to metrics.extra here so every sink writes them. Collectives are allowed here.
  virtual void on_collect_metrics(CallbackContext&, StepMetrics&) {}
  virtual void on_step_end(CallbackContext&, const StepMetrics&) {}
  virtual void on_evaluation_end(CallbackContext&, const EvalMetrics&) {}
  // A checkpoint's files are complete on this rank's disk (a background save: at the first step
  // boundary after its writer finished). Rank-local timing: no collectives here.
  virtual void on_checkpoint_saved(CallbackContext&, const CheckpointEvent&) {}
  virtual void on_train_end(CallbackContext&) {}
  // Training failed; `what` is the error. Called before the error leaves the trainer.
  virtual void on_exception(CallbackContext&, const std::string& /*what*/) {}
};

}  // namespace tessera
