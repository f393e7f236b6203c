// Serialised TensorBoard Event messages, as the bytes of one TFRecord. This header carries no
// protobuf: its implementation is compiled apart from LibTorch's include path, which ships an
// older, partial copy of the protobuf headers that would shadow the system's (see README.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera::tensorboard {

// Event{wall_time, file_version}: the first record of every event file.
std::string file_version_event(double wall_time, const std::string& version);
// Event{wall_time, step, summary{value{tag, simple_value}...}}.
std::string scalars_event(double wall_time, std::int64_t step,
                          const std::vector<std::pair<std::string, float>>& scalars);
// Event{wall_time, step, session_log{status: START}}: readers drop what an earlier attempt
// logged at this step and later.
std::string session_start_event(double wall_time, std::int64_t step);

}  // namespace tessera::tensorboard
