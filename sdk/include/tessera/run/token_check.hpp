// The token ids of a batch against the model's vocabulary, checked on the host before the batch
// reaches the device: an id past the embedding is otherwise an index error deep in the model on
// a CPU, and on a GPU a device-side assert that ends the CUDA context without naming the data.
// The trainer checks every micro-batch it draws and evaluate_loss every batch it evaluates; a
// plugin with its own loop over a dataset (a callback scoring a model) can call it the same way.
#pragma once

#include <cstdint>

#include "tessera/run/batch.hpp"
#include "tessera/export.hpp"

namespace tessera {

// Throws tessera::Error naming the first id of `batch` outside [0, vocab_size) (labels may also
// be kIgnoreIndex), its tensor, row and position. Host tensors only (datasets make them there);
// a batch already on a device, or vocab_size <= 0, is not checked.
TESSERA_API void check_token_ids(const Batch& batch, std::int64_t vocab_size);

}  // namespace tessera
