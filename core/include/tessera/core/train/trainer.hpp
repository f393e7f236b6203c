// The training loop: micro-batches with gradient accumulation, the loss normalised by the number
// of target tokens in the whole step, clipping by the global gradient norm, the scheduled
// learning rate, callbacks at every event, checkpoints, and the stop conditions. One rank or
// many, a step has one shape: the parallel strategy (the local one for a single rank) decides
// who holds what and which collectives run.
//
//   trainer.cpp        construction, the loop (stop and save agreement, events), saving
//   trainer_step.cpp   one step, phase by phase
//   local_schedule.cpp a step's micro-batches one after another through the whole model
//   pipeline_step.cpp  a step's forwards and backwards through pipeline stages
//   trainer_state.cpp  capture() and restore(): the trainer's state for checkpoints
//   trainer_export.cpp what a model export holds in each format
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/components/adapter.hpp"
#include "tessera/components/callback.hpp"
#include "tessera/run/context.hpp"
#include "tessera/core/checkpoint/checkpoint_settings.hpp"
#include "tessera/core/checkpoint/checkpoint_state.hpp"
#include "tessera/core/checkpoint/checkpoint_store.hpp"
#include "tessera/core/checkpoint/checkpointer.hpp"
#include "tessera/core/train/component_fault.hpp"
#include "tessera/core/train/micro_batch_graph.hpp"
#include "tessera/core/train/throughput.hpp"
#include "tessera/core/train/trainer_settings.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/components/prompt_source.hpp"
#include "tessera/generation/generate.hpp"
#include "tessera/generation/group_advantages.hpp"
#include "tessera/run/metric_value.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"
#include "tessera/components/strategy.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/parallel/optimizer_placements.hpp"
#include "tessera/parallel/placement.hpp"
#include "tessera/components/scheduler.hpp"

namespace tessera::core {

// How errors name the components: "model/gpt", "callback/health (components.callbacks[0])". The
// run fills them from its spec; parts built in code keep these defaults.
struct ComponentNames {
  std::string model = "the model", train_data = "the train_data dataset", loss = "the loss",
              optimizer = "the optimizer", scheduler = "the scheduler";
  std::vector<std::string> callbacks;  // by position in TrainerParts::callbacks
};

struct TrainerParts {
  std::shared_ptr<Model> model;
  std::shared_ptr<Dataset> train_data;
  std::shared_ptr<Loss> loss;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<Scheduler> scheduler;  // null: constant learning rate
  std::vector<std::shared_ptr<Callback>> callbacks;
  // How the ranks share a step; null: the local strategy (a run of one rank).
  std::shared_ptr<ParallelStrategy> parallel;
  // components.adapters, as applied to the model (in order), and the names of the parameters
  // they added to it: exports keep those apart from the base, or merge them into it.
  std::vector<std::shared_ptr<Adapter>> adapters;
  std::set<std::string> adapter_parameters;
  ComponentNames names;
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

// What the trainer needs to write checkpoints (the run plan fills it).
struct CheckpointContext {
  CheckpointSettings settings;
  CheckpointStore store;          // where checkpoints and exports go
  std::string strategy = "none";  // the parallel variant, recorded in the metadata
  std::string config_yaml;        // the resolved spec
  std::string model_config_json;  // the model's component spec, next to exports
  // Where the model's base weights came from (its init_from): a PEFT export's base model.
  std::string base_model;
  std::chrono::milliseconds timeout{300000};
};

// `model` on `device`: its buffers and the parameters with storage moved there, its deferred
// parameters (tessera/nn/deferred_init.hpp) given storage there and their initial values, unless
// `keep_deferred` (a strategy that materialises them itself, a unit at a time).
void place_model(Model& model, const c10::Device& device, bool keep_deferred);

class Trainer : private CallbackEvents {
 public:
  // `peak_flops`: one device's peak FLOP/s for MFU (settings.peak_flops); 0: the table of known
  // devices.
  Trainer(TrainerParts parts, TrainerSettings settings, RunContext context, double peak_flops = 0);
  ~Trainer() override;

  // Saves every checkpoint.every_steps, when a callback asks, and at the end; exports likewise.
  void enable_checkpoints(CheckpointContext context);
  // Continues from a checkpoint: model, optimizer (resharded to this run's ranks and strategy),
  // data position, generators, step, tokens, samples and time. Call before fit().
  void restore(const std::string& checkpoint_path);
  // The checkpoint's model weights alone (placed and sharded as restore() places them): what
  // `tessera eval` evaluates. The training data's position is not read, so a checkpoint can be
  // evaluated on other data than it was trained on. A run whose loss keeps a reference copy
  // (loss/dpo without adapters) reads the checkpoint's reference model too.
  void restore_model(const std::string& checkpoint_path);
  // This rank's state as host copies (a collective under fsdp: every rank calls it).
  CheckpointState capture();
  // The whole model's parameters on every rank, by name: the strategy's data-parallel shards
  // gathered (a collective under zero and fsdp), then each tensor- or expert-parallel part
  // gathered over its axis (Placements::whole_everywhere). What generation and RL rollouts under
  // ddp, fsdp and tp read. Every rank calls it; refused under a pipeline.
  StateDict whole_weights();

  // Runs steps until a stop condition holds; callbacks see every event (docs/observability.md).
  TrainResult fit();
  // One optimizer step (all micro-batches of it), with the step's metrics complete (callbacks'
  // on_collect_metrics included) but before on_step_end. fit() calls this; tests call it directly.
  StepMetrics step();
  // The ids that end a rollout's completion (Loss::rollouts): the model folder's generation_config
  // (the run sets them); when none, the prompt dataset's tokenizer EOS. Call before fit().
  void set_eos_token_ids(std::vector<std::int64_t> ids);
  // What MFU is measured against (settled at construction).
  const PeakFlops& peak_flops() const { return peak_; }

  const TrainProgress& progress() const { return progress_; }
  Model& model() { return *parts_.model; }
  const std::vector<std::shared_ptr<Adapter>>& adapters() const { return parts_.adapters; }
  Loss& loss() { return *parts_.loss; }
  // The run's reference model (loss/dpo's: the base with adapters off, or the frozen copy of the
  // starting weights) as a function for evaluations; it lives as long as the trainer.
  ReferenceLogits reference_forward();
  // The run's context, with the communicator joined.
  const RunContext& context() const { return context_; }
  // Parameters of the whole model (a tensor-parallel rank holds a part of them, a pipeline stage
  // its blocks'): the trainable ones (all but what adapters froze), and all of them.
  std::int64_t parameter_count() const { return whole_trainable_; }
  std::int64_t total_parameter_count() const { return whole_parameters_; }
  // Set by the first step.
  const MemoryReport& memory() const { return memory_; }

 private:
  // The phases of step(), in order (trainer_step.cpp); each is one job.
  struct StepInputs;   // the step's micro-batches and their token counts over all ranks
  struct StepClock;    // when each phase ended
  StepInputs fetch();
  void sum_over_ranks(StepInputs& inputs);  // the step's counts over the data-parallel ranks
  // A loss that trains on sampled completions (Loss::rollouts; trainer_rollout.cpp): the step's
  // micro-batches come from a rollout, sampled every num_iterations steps.
  struct Rollout;
  void check_rollout_setup();
  StepInputs fetch_rollout();
  std::unique_ptr<Rollout> sample_rollout();
  void take_old_logps(Rollout& rollout);
  void hand_rollout_rows();  // before each micro-batch's loss
  // The rollout in a checkpoint's data state, saved between its steps (num_iterations > 1), and
  // taken back out of it when restoring.
  void save_rollout(StateDict& data) const;
  void load_rollout(StateDict& data, const std::string& checkpoint_path);
  void record_rollout_metrics(const at::Tensor& all, const GroupAdvantages& advantages, std::int64_t rewards);
  void write_rollouts(std::int64_t step, const std::vector<Prompt>& prompts, const std::vector<GenerationResult>& results,
                      const std::vector<RewardInput>& inputs, const at::Tensor& table,
                      const GroupAdvantages& advantages, const at::Tensor& mine);
  // How the step's micro-batches run (step_schedule.hpp): chosen once, at construction.
  class StepSchedule;
  class LocalSchedule;
  class PipelineSchedule;
  // Forward, loss and backward of one micro-batch; its summed loss, detached.
  at::Tensor micro_batch(const MicroBatchInputs& inputs, double aux_weight);
  LossSum forward_loss(const at::Tensor& input_ids, const at::Tensor& labels, const at::Tensor& documents);
  void reference_pass(const at::Tensor& input_ids, const at::Tensor& labels, const at::Tensor& documents);
  at::Tensor reference_logits(const at::Tensor& input_ids, const at::Tensor& documents);
  void add_loss_metrics(StepMetrics& m);
  LossAndGradNorm reduce(const at::Tensor& loss_sum, const StepInputs& inputs);
  struct SkipDecision {
    bool skip = false;       // the optimizer step is not applied (a request, a known non-finite step)
    bool nonfinite = false;  // known on the host: the loss or the gradient norm is NaN/Inf on some rank
    // The non-finite flag (0/1), the step's loss and the gradient norm, on their way to the host
    // in one copy; record() takes the loss and the norm from it.
    std::shared_ptr<const AsyncValues> values;
    // The optimizer was given the flag on the device (fused AdamW): nobody waited for it, and it
    // is judged at the next step's decision (settle_pending_nonfinite).
    bool judged_later = false;
    static constexpr std::size_t kFlag = 0, kLoss = 1, kGradNorm = 2;
  };
  SkipDecision agree_on_skip(CallbackContext& ctx, const LossAndGradNorm& reduced);
  // Counts a non-finite step, logs it, and decides whether the run must end (trainer.nonfinite);
  // `values` as in SkipDecision, read only when the step was non-finite.
  void judge_nonfinite(std::int64_t step, bool nonfinite, const AsyncValues& values);
  // Judges the last step's flag where it was left to travel (SkipDecision::judged_later). Called
  // from the next step's decision, when its forward and backward are queued and the flag has long
  // landed, and before a save or the end of fit(): a step itself never waits for its flag.
  void settle_pending_nonfinite();
  double update(const at::Tensor& grad_norm, bool skipped);
  StepMetrics record(CallbackContext& ctx, const StepInputs& inputs, double lr,
                     const SkipDecision& decision, const StepClock& clock);

  // The model's parameters and buffers from a read checkpoint (restore and restore_model).
  void load_model_state(const LoadedCheckpoint& ck, const std::string& checkpoint_path);
  std::string stop_reason() const;
  // stop_reason() and the save requests, agreed by all ranks in one collective: if one stops,
  // all stop after this step; if a callback on one asked for a checkpoint, all save.
  std::string agree_on_stop_and_save(bool& save_requested);
  // The periodic, final or requested save and export due after the steps done so far.
  void save_if_due(bool stopping, bool save_requested);
  // Saves (checkpoint and/or export) the current step; every rank calls it at the same step.
  void save(bool checkpoint, bool export_model, const char* why);
  // Rank 0: what the export format makes of the captured weights (trainer_export.cpp): a
  // Hugging Face folder (adapters merged), a PEFT folder, or Tessera's with adapters apart.
  void prepare_export(CheckpointState& captured) const;
  CallbackContext callback_context();
  // Calls `call(callback)` on every callback in order for `event`, each under its name: an
  // exception becomes a ComponentFault naming the callback, the event and the step.
  // `step`: the step the event belongs to, for the message.
  template <class Call>
  void for_each_callback(const char* event, std::int64_t step, Call&& call);
  // The same for the events after the step's own collectives (on_collect_metrics, on_step_end):
  // in fit(), a fault there is kept for agree_on_stop_and_save, so every rank can write an
  // emergency checkpoint of the consistent state before the run fails.
  template <class Call>
  void for_each_callback_at_step_boundary(const char* event, Call&& call);  // step: progress_.step
  std::string callback_name(std::size_t i) const;
  // After a callback's fault at a step boundary on some rank (faulted_rank_): the emergency
  // checkpoint, then the error, on every rank.
  [[noreturn]] void end_after_fault();
  void evaluation_end(CallbackContext& ctx, const EvalMetrics& metrics) override;
  // on_checkpoint_saved for the checkpoints this rank's writer finished since the last call.
  void announce_saved_checkpoints(CallbackContext& ctx);
  void fill_rates(StepMetrics& m, std::int64_t seq_len, std::chrono::steady_clock::time_point begin,
                  std::chrono::steady_clock::time_point end);
  // Saves the state (unchanged by the non-finite steps) and throws nonfinite_failure_.
  [[noreturn]] void end_after_nonfinite_steps();
  // Waits for the background save; rethrows its failure on every rank if it failed on any.
  void wait_for_last_save();
  double elapsed_s() const;
  MemoryReport measure_memory() const;

  // Where each optimizer parameter lives (its name, placement and the strategy's share of it),
  // built once after the strategy's setup (a collective of the share groups).
  std::shared_ptr<const OptimizerPlacements> place_optimizer_parameters() const;

  TrainerParts parts_;
  TrainerSettings settings_;
  // Loss::rollouts(), the prompts (Dataset::prompts()), the rollout being trained on and its next
  // micro-batch, the ids that end a completion, and TRL's metrics of a rollout sampled this step.
  const RolloutSettings* rollout_settings_ = nullptr;
  PromptSource* prompts_ = nullptr;
  std::unique_ptr<Rollout> rollout_;
  std::size_t rollout_row_ = 0;
  std::vector<std::int64_t> eos_token_ids_;
  std::map<std::string, double> rollout_metrics_;
  bool rollouts_started_ = false;  // rank 0: rollouts.jsonl was started (or kept, resuming)
  RunContext context_;
  // The run's mesh (the data-parallel-only one when the context has none): the strategy works
  // over its data-parallel group, the loss and norm over its loss group.
  std::shared_ptr<const DeviceMesh> mesh_;
  // Where every parameter's whole lives on the mesh: checkpoints, counts and the norm go by it.
  Placements placements_;
  // ... and every optimizer parameter's, shares included: the optimizer gets them
  // (Optimizer::set_placements), checkpoints write and cut by them, the norm counts by them.
  std::shared_ptr<const OptimizerPlacements> optimizer_placements_;
  std::unique_ptr<StepSchedule> schedule_;
  c10::Device device_;
  at::ScalarType compute_dtype_;  // settings.precision
  bool needs_reference_ = false;  // the loss compares with the reference model (Loss::needs_reference)
  // ... and without adapters that reference is a frozen copy of the starting weights, held by the
  // strategy (ParallelStrategy::keep_reference_weights), taken before the first step's forward
  // or loaded from the checkpoint a run resumes.
  bool keeps_reference_copy_ = false;
  void keep_reference_copy();
  void load_reference_copy(const LoadedCheckpoint& ck, const std::string& checkpoint_path);
  bool hidden_loss_ = false;      // the loss takes hidden states and the model has an output head
  std::int64_t vocab_size_ = 0;   // the model's: every batch's token ids are checked against it
  bool warned_unmasked_documents_ = false;
  // trainer.nonfinite: steps skipped as NaN/Inf, in a row and in all; set when the run must end.
  std::int64_t nonfinite_in_a_row_ = 0, nonfinite_total_ = 0;
  std::string nonfinite_failure_;
  struct PendingNonfinite {
    std::int64_t step = 0;
    std::shared_ptr<const AsyncValues> values;  // as SkipDecision::values
  };
  std::optional<PendingNonfinite> pending_nonfinite_;
  // A callback's fault at a step boundary on this rank, and the rank agreed to have one (-1: none).
  std::unique_ptr<ComponentFault> boundary_fault_;
  std::int64_t faulted_rank_ = -1;
  bool in_fit_ = false;
  bool in_step_ = false;  // inside step(): a fault there leaves the step half done
  TrainProgress progress_;
  TrainerControl control_;
  ParallelStrategy& strategy_;  // *parts_.parallel
  std::chrono::steady_clock::time_point started_;
  MemoryReport memory_;
  std::unique_ptr<Checkpointer> checkpointer_;
  CheckpointContext checkpoint_;
  std::int64_t last_checkpoint_step_ = -1, last_export_step_ = -1;
  double elapsed_before_ = 0;  // training time of the run this one resumed
  double pause_s_ = 0;         // time the last save held training (reported with the next step)
  std::string restored_from_;  // the checkpoint restore() read, for the checkpoint-loaded event
  PeakFlops peak_;
  // The training FLOPs per token MFU counts at sequence length `seq_len`: the model's own, or
  // with adapters those of a frozen base and trained adapters (adapted_flops_per_token).
  double flops_per_token(std::int64_t seq_len) const;
  // With parameters frozen (adapters): the share of the model's own elements that are frozen,
  // and the elements adapters added (whole model). 0 and 0 when everything trains.
  double frozen_share_ = 0, added_parameters_ = 0;
  // parameter_count() and total_parameter_count().
  std::int64_t whole_parameters_ = 0, whole_trainable_ = 0;
  // The counts above, once at the start (a collective over the pipeline's stages).
  void count_parameters();
  // This process's steps, for the ETA (a resumed run's rate is its own): counted, and the
  // tokens and start time of those after the first.
  std::int64_t run_steps_ = 0, run_tokens_ = 0;
  std::chrono::steady_clock::time_point rate_start_;
  // trainer.cuda_graph; declared last, so it goes before the components whose memory it uses.
  std::unique_ptr<MicroBatchGraph> graph_;
};

template <class Call>
inline void Trainer::for_each_callback(const char* event, std::int64_t step, Call&& call) {
  for (std::size_t i = 0; i < parts_.callbacks.size(); ++i) {
    in_component(callback_name(i), event, step, [&] { call(*parts_.callbacks[i]); });
  }
}

// Every callback is called even after one failed: the others may run collectives here (the
// evaluation, the monitors' all-reduces), which every rank must issue alike. The first fault is kept.
template <class Call>
inline void Trainer::for_each_callback_at_step_boundary(const char* event, Call&& call) {
  for (std::size_t i = 0; i < parts_.callbacks.size(); ++i) {
    try {
      in_component(callback_name(i), event, progress_.step, [&] { call(*parts_.callbacks[i]); });
    } catch (const ComponentFault& fault) {
      if (!in_fit_) throw;
      if (!boundary_fault_) boundary_fault_ = std::make_unique<ComponentFault>(fault);
    }
  }
}

}  // namespace tessera::core
