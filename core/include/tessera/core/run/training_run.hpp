// One run from its plan: load the plugins, validate every component, then (for `train`) join
// the process group, seed, build, write the resolved config and run the loop. Teardown order is
// fixed: components, then the registry, then the plugin libraries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/core/run/run_plan.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/components/evaluate.hpp"

namespace tessera::core {

struct EvalOptions {
  std::string split = "eval";        // eval: the evaluation callback's data; train: train_data
  std::int64_t batches = 10;         // micro-batches in all, split evenly over the ranks
  std::int64_t micro_batch_size = 0;  // 0: the evaluation callback's, else the trainer's
};

class TrainingRun {
 public:
  // Plans the run, loads the plugins and validates everything; builds nothing. Throws
  // ConfigIssue or PluginLoadError.
  explicit TrainingRun(const RunOptions& options);

  const RunPlan& plan() const { return plan_; }
  const PluginHost& plugins() const { return host_; }

  // Builds the components, hands them to a Trainer (resumed when options asked for it, with
  // checkpoints enabled) and runs it to a stop condition.
  TrainResult train();
  // Builds the trainer without running it (tests drive single steps).
  std::unique_ptr<Trainer> make_trainer();

  // --- tessera plan (core/src/plan/) ---------------------------------------------------------
  // The checks `tessera validate` makes, for a run of this spec on the mesh `dims` instead of
  // the spec's own (components, model splits, the pipeline's micro-batches). Throws ConfigIssue.
  void check_mesh(const ParallelDims& dims) const;
  // The spec's model alone (with its adapters) as the rank of `context` builds it (context.mesh
  // set), inside a DeferredInitScope: a model that defers its initialisation holds shapes, not
  // memory. Keep it no longer than this TrainingRun (its plugin stays loaded that long).
  std::shared_ptr<Model> build_model(const RunContext& context) const;
  // Whether the run keeps a frozen copy of the starting weights as its loss's reference model
  // (Loss::needs_reference, loss/dpo, without adapters): the loss is built alone to ask it.
  bool keeps_reference_copy() const;
  // `tessera validate`: the spec's adapters applied to its model built on the meta device, so a
  // target that names no layer of the model is reported at its position. Throws ConfigIssue.
  void check_adapters() const;
  // `tessera eval`: the model as built (init_from) or as a checkpoint left it (options' resume),
  // its loss over the first batches of a dataset of the spec, reduced over the ranks
  // (core/src/run/evaluation.cpp).
  EvalTotals evaluate(const EvalOptions& options);

 private:
  RunPlan plan_;  // completed by the constructor (component defaults), fixed after it
  PluginHost host_;
  std::shared_ptr<Communicator> communicator_;  // joined by make_trainer()
};

// The run's plan, with the process-wide effects of planning it: the log level, and the rank
// prefix of its lines under torchrun or srun.
RunPlan plan_and_configure_logging(const RunOptions& options);

// Refuses (ConfigIssue) a model asked to split over a mesh axis of the plan's context that its
// config does not declare (Schema::mesh_axes), and a sequence those splits cannot cut.
void check_model_splits(const RunPlan& plan, const Registry& registry);

// The process-wide settings of a run's plan (deterministic algorithms, TF32, threads, the seeds)
// and its communicator: the local one, or the process group of its ranks (Gloo, or NCCL on
// CUDA). Refuses first a CUDA device the machine lacks.
std::shared_ptr<Communicator> start_process(const RunPlan& plan);

// --resume auto: the newest valid checkpoint under the plan's checkpoint folder as rank 0 finds
// it ("" for none), on every rank of `comm`.
std::string agreed_resumable_checkpoint(const RunPlan& plan, Communicator& comm);

// Seeds every RNG the run may use from one seed; touches CUDA only for a cuda device.
void seed_everything(std::uint64_t seed, const std::string& device);

}  // namespace tessera::core
