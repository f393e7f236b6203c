// How a step's micro-batches run on this rank, chosen once when the trainer is built: one after
// another through the whole model (LocalSchedule, local_schedule.cpp), or through this rank's
// pipeline stages in the pipeline schedule's order (PipelineSchedule, pipeline_step.cpp). A folder
// of their own beside core/src/train: what the pipeline and context-parallel axes change in a step
// lives here, not in the trainer's loop. Private to the trainer: the schedules are its own parts.
#pragma once

#include <memory>
#include <vector>

#include "tessera/core/train/trainer.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/pipeline_parallel.hpp"
#include "tessera/run/memory_stats.hpp"
#include "../train/step_inputs.hpp"

namespace tessera::core {

class Trainer::StepSchedule {
 public:
  // The schedule the run's mesh needs: through this rank's pipeline stages under
  // parallelism.pp > 1, else through the whole model. Refuses first what split sequences cannot
  // run (a loss that sums each sequence's log-probabilities under pp or cp, a model without
  // hidden states and head under cp), naming the setting to change.
  static std::unique_ptr<StepSchedule> for_mesh(Trainer& trainer);
  explicit StepSchedule(Trainer& trainer);
  virtual ~StepSchedule() = default;
  StepSchedule(const StepSchedule&) = delete;
  StepSchedule& operator=(const StepSchedule&) = delete;

  // The step's forwards and backwards, every micro-batch's loss divided by the step's tokens;
  // returns this rank's summed loss (a device scalar; zero where this rank computes none).
  virtual at::Tensor forward_backward(StepInputs& inputs, CallbackContext& ctx) = 0;
  // Whether this rank computes the loss (under a pipeline, the last stage alone).
  virtual bool computes_loss() const { return true; }
  // Whether the loss takes the hidden states and head rather than logits: this rank's slice of
  // each sequence under context parallelism (with the slice's labels), a pipeline's last stage.
  virtual bool loss_from_hidden_states() const { return sequence_.size() > 1; }
  // Whether trainer.cuda_graph can capture the schedule's micro-batches: no pipeline transfers
  // and no context-parallel exchanges of its own (the strategy's are the trainer's to refuse).
  virtual bool capturable() const { return false; }
  // After the strategy's reduction of the gradients, before their norm.
  virtual void finish_gradients() {}
  // The step's metrics of the schedule itself, with the step's memory (before the peak resets).
  virtual void record(StepMetrics&, const MemoryStats&) {}
  // At the run's end, a summary in the log.
  virtual void log_summary() const {}
  // The labels of the part of each sequence this rank's model computes: under context
  // parallelism the hidden states are this rank's slice of the sequence.
  at::Tensor labels_of_slice(const at::Tensor& labels) const { return sequence_.slice(labels); }

 protected:
  Trainer& t_;
  const ContextParallel sequence_;
};

class Trainer::LocalSchedule final : public Trainer::StepSchedule {
 public:
  using StepSchedule::StepSchedule;
  // Under trainer.cuda_graph the micro-batches run on the graph's stream, replayed once captured.
  at::Tensor forward_backward(StepInputs& inputs, CallbackContext& ctx) override;
  bool capturable() const override { return sequence_.size() == 1; }
};

class Trainer::PipelineSchedule final : public Trainer::StepSchedule {
 public:
  // The pipeline's transport over the run's mesh; every stage's adapter names gathered (an
  // export on rank 0 keeps them apart from the base, or merges them).
  explicit PipelineSchedule(Trainer& trainer);
  at::Tensor forward_backward(StepInputs& inputs, CallbackContext& ctx) override;
  bool computes_loss() const override { return pipeline_.holds_last_stage(); }
  bool loss_from_hidden_states() const override { return true; }  // the head is the last stage's
  // A tied embedding summed over the pipeline's two ends.
  void finish_gradients() override;
  // pipeline_idle_share: this step's waiting for other stages over its forward-backward time.
  void record(StepMetrics& m, const MemoryStats& memory) override;
  void log_summary() const override;

 private:
  PipelineParallel pipeline_;  // this rank's stages (the model holds their blocks)
  // This step's seconds waiting for another stage's data (receives and the step's last sends),
  // and per step its share of the forward-backward time and the activation high-water mark (peak
  // less resident memory), logged at the run's end.
  double wait_s_ = 0;
  std::vector<double> idle_shares_, activation_bytes_;
};

}  // namespace tessera::core
