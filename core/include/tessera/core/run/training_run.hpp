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
  // --resume auto: the newest valid checkpoint as rank 0 finds it ("" for none), on every rank.
  std::string agreed_resumable_checkpoint(Communicator& comm) const;

  RunPlan plan_;  // completed by the constructor (component defaults), fixed after it
  PluginHost host_;
  std::shared_ptr<Communicator> communicator_;  // joined by make_trainer()
};

// Seeds every RNG the run may use from one seed; touches CUDA only for a cuda device.
void seed_everything(std::uint64_t seed, const std::string& device);

}  // namespace tessera::core
