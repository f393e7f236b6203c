// The protobuf side of callback/tensorboard: builds Event messages from tensorboard_event.proto
// and serialises them. Compiled without LibTorch's include path (see event_encoding.hpp).
#include "event_encoding.hpp"

#include "tensorboard_event.pb.h"

namespace tessera::tensorboard {

namespace {
std::string serialized(const ::tensorboard::Event& event) {
  std::string bytes;
  event.SerializeToString(&bytes);
  return bytes;
}
}  // namespace

std::string file_version_event(double wall_time, const std::string& version) {
  ::tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version(version);
  return serialized(event);
}

std::string scalars_event(double wall_time, std::int64_t step,
                          const std::vector<std::pair<std::string, float>>& scalars) {
  ::tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  ::tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    ::tensorboard::Summary::Value* entry = summary->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(value);
  }
  return serialized(event);
}

std::string session_start_event(double wall_time, std::int64_t step) {
  ::tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  event.mutable_session_log()->set_status(::tensorboard::SessionLog::START);
  return serialized(event);
}

}  // namespace tessera::tensorboard
