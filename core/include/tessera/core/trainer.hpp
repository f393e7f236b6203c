// The training loop: micro-batches with gradient accumulation, the loss normalised by the number
// of target tokens in the whole step, clipping by the global gradient norm, the scheduled
// learning rate, callbacks at every event, and the stop conditions.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tessera/callback.hpp"
#include "tessera/context.hpp"
#include "tessera/core/run_spec.hpp"
#include "tessera/dataset.hpp"
#include "tessera/loss.hpp"
#include "tessera/model.hpp"
#include "tessera/optimizer.hpp"
#include "tessera/parallel.hpp"
#include "tessera/scheduler.hpp"

namespace tessera::core {

struct TrainerParts {
  std::shared_ptr<Model> model;
  std::shared_ptr<Dataset> train_data;
  std::shared_ptr<Loss> loss;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<Scheduler> scheduler;  // null: constant learning rate
  std::vector<std::shared_ptr<Callback>> callbacks;
  // How the ranks share a step; null only for a run of one rank (plain single-process step).
  std::shared_ptr<ParallelStrategy> parallel;
};

// Bytes this rank holds between steps; measured after the first step, when optimizer state exists.
struct MemoryReport {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t total() const { return parameters + gradients + optimizer_state; }
};

struct TrainResult {
  std::int64_t steps = 0;
  std::int64_t tokens = 0;
  double elapsed_s = 0;
  double first_loss = 0;
  double last_loss = 0;
  std::string stop_reason;
};

class Trainer {
 public:
  Trainer(TrainerParts parts, TrainerSettings settings, RunContext context);

  // Runs steps until a stop condition holds; callbacks see train begin/end and every step.
  TrainResult fit();
  // One optimizer step (all micro-batches of it). fit() calls this; tests call it directly.
  StepMetrics step();

  const TrainProgress& progress() const { return progress_; }
  Model& model() { return *parts_.model; }
  // Set by the first step.
  const MemoryReport& memory() const { return memory_; }

 private:
  std::string stop_reason() const;
  // stop_reason(), agreed by all ranks: if one stops, all stop after this step.
  std::string agreed_stop_reason();
  CallbackContext callback_context();
  double elapsed_s() const;
  MemoryReport measure_memory() const;

  TrainerParts parts_;
  TrainerSettings settings_;
  RunContext context_;
  c10::Device device_;
  TrainProgress progress_;
  TrainerControl control_;
  std::vector<at::Tensor> parameters_;
  std::chrono::steady_clock::time_point started_;
  MemoryReport memory_;
};

}  // namespace tessera::core
