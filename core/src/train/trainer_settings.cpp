#include "tessera/core/train/trainer_settings.hpp"

namespace tessera::core {

void TrainerSettings::declare(ConfigFields<TrainerSettings>& f) {
  using T = TrainerSettings;
  f.field("max_steps", &T::max_steps, "stop after this many optimizer steps (0: no limit)").at_least(0);
  f.field("max_tokens", &T::max_tokens, "stop once this many input tokens were consumed (0: no limit)").at_least(0);
  f.field("max_time_s", &T::max_time_s, "stop after this many seconds of training (0: no limit)").at_least(0);
  f.field("max_epochs", &T::max_epochs,
          "stop at the end of the data: once this many passes over train_data were read (fractions allowed; 0: no "
          "limit)")
      .at_least(0);
  f.field("grad_accum", &T::grad_accum, "micro-batches per optimizer step").at_least(1);
  f.field("micro_batch_size", &T::micro_batch_size, "samples per micro-batch").required().at_least(1);
  f.field("clip_grad_norm", &T::clip_grad_norm, "clip gradients to this global L2 norm (0: off)").at_least(0);
  f.field("prefetch", &T::prefetch,
          "micro-batches a background thread reads ahead (pinned memory on GPUs; 0: read in the step)")
      .at_least(0);
  f.field("nonfinite", &T::nonfinite,
          "a step whose loss or global gradient norm is NaN/Inf: skip (leave weights and optimizer state as they "
          "were, count and log it), stop (the same, then save a checkpoint and end the run with an error) or ignore "
          "(apply the update)")
      .one_of({"skip", "stop", "ignore"});
  f.field("nonfinite_max_consecutive", &T::nonfinite_max_consecutive,
          "with nonfinite: skip, this many non-finite steps in a row end the run as stop does")
      .at_least(1);
  f.field("cuda_graph", &T::cuda_graph,
          "capture the forward and backward of a micro-batch in a CUDA graph after two eager warm-up steps and "
          "replay it for every micro-batch of the same shape (one process, settings.device cuda; the model must not "
          "wait for the host: not gpt_moe, not with activation_checkpointing)");
  f.check([](const T& t) {
    if (t.max_steps == 0 && t.max_tokens == 0 && t.max_time_s == 0 && t.max_epochs == 0) {
      throw ConfigError("no stop condition: set max_steps, max_tokens, max_time_s or max_epochs");
    }
  });
}

}  // namespace tessera::core
