// Verifying a checkpoint folder and reading back what one rank needs to resume.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tessera/core/checkpoint/checkpoint_state.hpp"

namespace tessera::core {

// What a reader needs of a checkpoint: everything to resume training, or the model alone (to
// evaluate it: no optimizer state, data position or generators are read, or checked).
// What a reader needs: everything (a resume), the model alone (an evaluation), or the model and
// the reference copy a loss compares with (an evaluation of loss/dpo).
enum class CheckpointParts { everything, model, model_and_reference };

// Checks a checkpoint folder: metadata readable and of a known format, every listed file (of
// `parts`) present with its size and CRC-32C. Throws CheckpointError saying what is wrong.
CheckpointMetadata verify_checkpoint(const std::string& path, CheckpointParts parts = CheckpointParts::everything);

// A rank's manifest.json: the files it wrote to the checkpoint in progress, with sizes and
// CRC-32Cs. Throws CheckpointError for a malformed one or a name outside the folder.
std::map<std::string, WrittenFile> read_rank_manifest(const std::string& path);

// Verifies, then reads what `rank` needs. Every rank reads every optimizer file when the state
// was sharded, so any number of ranks can resume from any other.
LoadedCheckpoint read_checkpoint(const std::string& path, std::int64_t rank,
                                 CheckpointParts parts = CheckpointParts::everything);

}  // namespace tessera::core
