// Writing a checkpoint crash-safely from every rank, and a model export.
#pragma once

#include <chrono>
#include <cstdint>

#include "tessera/core/checkpoint/checkpoint_state.hpp"
#include "tessera/core/checkpoint/checkpoint_store.hpp"

namespace tessera::core {

// Writes this rank's part of the checkpoint for state.step into the store. Rank 0 then waits
// (up to `timeout`) for every rank's manifest, writes metadata.json, renames the folder into
// place, points `latest` at it and prunes beyond `keep_last` (0: keep all).
// Returns false when a valid checkpoint of that step exists (nothing written); an invalid one is
// replaced.
bool write_checkpoint(const CheckpointStore& store, const CheckpointState& state, std::int64_t keep_last,
                      std::chrono::milliseconds timeout);
// Rank 0: the store's export folder of state.step, written then renamed: {model.safetensors,
// config.json (the model's component spec)}, or with state.hf_export a Hugging Face folder whose
// weights are sharded above `max_shard_bytes`.
void write_model_export(const CheckpointStore& store, const CheckpointState& state, std::uint64_t max_shard_bytes);

}  // namespace tessera::core
