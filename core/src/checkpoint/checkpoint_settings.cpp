#include "tessera/core/checkpoint/checkpoint_settings.hpp"

namespace tessera::core {

void CheckpointSettings::declare(ConfigFields<CheckpointSettings>& f) {
  using C = CheckpointSettings;
  f.field("dir", &C::dir, "where checkpoints go (default RUN_DIR/checkpoints)");
  f.field("every_steps", &C::every_steps, "save every this many steps (0: only at the end and on request)").at_least(0);
  f.field("keep_last", &C::keep_last, "keep the newest N complete checkpoints (0: keep all)").at_least(0);
  f.field("at_end", &C::at_end, "save when training stops (max_steps, time budget, SIGTERM/SIGINT)");
  f.field("async", &C::async, "copy the state to host memory at the step, write it in the background");
  f.field("export_every_steps", &C::export_every_steps, "export the model as safetensors every N steps (0: never)")
      .at_least(0);
  f.field("export_at_end", &C::export_at_end, "export the model as safetensors when training stops");
}

}  // namespace tessera::core
