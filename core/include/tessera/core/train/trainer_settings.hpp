// The `trainer` section of a run spec: how long to train and how a step is shaped. Declared once
// (tessera/config/config_fields.hpp): the members' initialisers are the documented defaults.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config/config_fields.hpp"

namespace tessera::core {

struct TrainerSettings {
  std::int64_t max_steps = 0;   // 0: no limit
  std::int64_t max_tokens = 0;  // input tokens, all ranks; 0: no limit
  double max_time_s = 0;        // wall-clock budget; 0: no limit
  double max_epochs = 0;        // passes over train_data (samples / its num_samples); 0: no limit
  std::int64_t grad_accum = 1;
  std::int64_t micro_batch_size = 1;  // required in a spec; 1 for trainers built in code
  double clip_grad_norm = 0;          // 0: no clipping (the norm is still measured)
  std::int64_t prefetch = 2;          // micro-batches read ahead by a background thread; 0: none
  // A step whose loss or global gradient norm is NaN/Inf: skip (no update, counted, logged),
  // stop (no update, save, fail) or ignore (apply it). Skipping stops the run after
  // nonfinite_max_consecutive such steps in a row.
  std::string nonfinite = "skip";
  std::int64_t nonfinite_max_consecutive = 10;
  // Capture a micro-batch's forward and backward in a CUDA graph after warm-up and replay it
  // (one process on a CUDA device; micro-batches of another shape run eagerly).
  bool cuda_graph = false;

  static void declare(ConfigFields<TrainerSettings>& f);
};

}  // namespace tessera::core
