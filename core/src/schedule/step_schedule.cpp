// The step's schedule chosen for the run's mesh (step_schedule.hpp), and what the mesh's split
// sequences refuse.
#include "step_schedule.hpp"

#include "tessera/error.hpp"

namespace tessera::core {

std::unique_ptr<Trainer::StepSchedule> Trainer::StepSchedule::for_mesh(Trainer& trainer) {
  const ParallelDims& dims = trainer.mesh_->dims();
  // What a split sequence cannot give: a loss that sums each sequence's log-probabilities, then
  // the hidden states and head that a context-parallel slice's loss takes.
  if (trainer.parts_.loss->needs_reference() && (dims.pp > 1 || dims.cp > 1)) {
    throw Error("trainer: " + trainer.parts_.names.loss + " sums each sequence's log-probabilities, which "
                "parallelism.pp and parallelism.cp split over ranks: set them to 1");
  }
  if (dims.cp > 1 && !trainer.parts_.model->has_output_head()) {
    throw Error("trainer: parallelism.cp needs a model that exposes its hidden states and output head");
  }
  if (dims.pp > 1) return std::make_unique<PipelineSchedule>(trainer);
  return std::make_unique<LocalSchedule>(trainer);
}

Trainer::StepSchedule::StepSchedule(Trainer& trainer)
    : t_(trainer), sequence_(ContextParallel::of(trainer.context_)) {}

}  // namespace tessera::core
