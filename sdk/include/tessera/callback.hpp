// Kind `callback`: code the trainer calls at fixed events of the loop. Callbacks run in the
// order the YAML lists them, may read the model and metrics, and may ask the loop to stop, to skip
// the optimizer step, or to save.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "tessera/context.hpp"
#include "tessera/export.hpp"

namespace tessera {

class Model;

// What happened in one optimizer step. Values are synchronised with the host once per step.
struct StepMetrics {
  std::int64_t step = 0;        // optimizer steps done, this one included (1-based)
  double loss = 0;              // summed loss / target tokens of the whole step
  double grad_norm = 0;         // global L2 norm before clipping
  double lr = 0;
  std::int64_t tokens = 0;      // input tokens consumed so far, all ranks (cumulative)
  std::int64_t step_tokens = 0; // input tokens in this step, all ranks
  std::int64_t target_tokens = 0;  // tokens with a label in this step: the loss's divisor
  double tokens_per_s = 0;      // this step's input tokens / step time
  double step_time_s = 0;
  double elapsed_s = 0;
  bool skipped = false;         // the optimizer step was skipped on a callback's request
  std::map<std::string, double> extra;  // further named metrics, written by every sink
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

struct CallbackContext {
  const RunContext& run;
  const TrainProgress& progress;
  Model& model;
  TrainerControl& control;
};

class TESSERA_API Callback {
 public:
  static constexpr const char* kKind = "callback";
  virtual ~Callback();

  virtual void on_train_begin(CallbackContext&) {}
  virtual void on_step_begin(CallbackContext&) {}
  // Gradients are final and the global norm (before clipping) is known. Reading the norm's value
  // synchronises with the device; callbacks that do not need it leave it alone.
  virtual void on_before_optimizer_step(CallbackContext&, const at::Tensor& /*grad_norm*/) {}
  virtual void on_step_end(CallbackContext&, const StepMetrics&) {}
  virtual void on_train_end(CallbackContext&) {}
  // Training failed; `what` is the error. Called before the error leaves the trainer.
  virtual void on_exception(CallbackContext&, const std::string& /*what*/) {}
};

}  // namespace tessera
