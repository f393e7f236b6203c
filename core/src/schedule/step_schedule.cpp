// The step's schedule chosen for the run's mesh (step_schedule.hpp), and what every schedule
// refuses of context parallelism.
#include "step_schedule.hpp"

#include "tessera/error.hpp"

namespace tessera::core {

std::unique_ptr<Trainer::StepSchedule> Trainer::StepSchedule::for_mesh(Trainer& trainer) {
  if (trainer.mesh_->dims().pp > 1) return std::make_unique<PipelineSchedule>(trainer);
  return std::make_unique<LocalSchedule>(trainer);
}

Trainer::StepSchedule::StepSchedule(Trainer& trainer)
    : t_(trainer), sequence_(ContextParallel::of(trainer.context_)) {
  if (sequence_.size() == 1) return;
  // This rank's model computes a slice of each sequence: the loss takes its hidden states.
  if (!t_.parts_.model->has_output_head()) {
    throw Error("trainer: parallelism.cp needs a model that exposes its hidden states and output head");
  }
  if (t_.parts_.loss->needs_reference()) {
    throw Error("trainer: " + t_.parts_.names.loss + " sums each sequence's log-probabilities, which "
                "parallelism.cp splits over ranks: set parallelism.cp: 1");
  }
}

}  // namespace tessera::core
