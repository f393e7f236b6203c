// Files of JSON lines keyed by step (metrics.jsonl, rollouts.jsonl) that a resumed run appends to.
#pragma once

#include <cstdint>
#include <filesystem>

#include "tessera/export.hpp"

namespace tessera {

// Keeps the lines of `path` whose integer "step" is at most `step` and drops the others (those of
// an attempt that did not reach its next checkpoint), replacing the file by a rename: a kill
// leaves the old file or the new one, never half. A missing file is created empty.
TESSERA_API void keep_jsonl_steps_up_to(const std::filesystem::path& path, std::int64_t step);

}  // namespace tessera
