#include "tessera/core/checkpoint/checkpointer.hpp"

#include <utility>

#include "tessera/core/checkpoint/checkpoint_writer.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/log.hpp"

namespace tessera::core {

Checkpointer::Checkpointer(CheckpointSettings settings, CheckpointStore store, std::chrono::milliseconds timeout)
    : settings_(std::move(settings)), store_(std::move(store)), timeout_(timeout) {}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    log::error("checkpoint: ", e.what());
  } catch (...) {
    log::error("checkpoint: the last save failed");
  }
}

void Checkpointer::wait() {
  if (writer_.joinable()) writer_.join();
  if (failure_) {
    std::exception_ptr failure = failure_;
    failure_ = nullptr;
    failed_ = false;
    std::rethrow_exception(failure);
  }
}

void Checkpointer::write(const CheckpointState& state, bool checkpoint, bool export_model) {
  const auto start = std::chrono::steady_clock::now();
  if (checkpoint) {
    if (!write_checkpoint(store_, state, settings_.keep_last, timeout_)) {
      log::info("checkpoint ", CheckpointStore::name_of(state.step), " exists already; not written again");
      checkpoint = false;
    }
  }
  if (checkpoint) {
    std::lock_guard<std::mutex> lock(completed_mutex_);
    completed_.push_back(state.step);
  }
  if (export_model && state.rank == 0) write_model_export(store_, state, parse_byte_size(settings_.export_max_shard_size));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (state.rank == 0 && checkpoint) {
    log::info("checkpoint ", store_.checkpoint(state.step).path().string(), " written in ", seconds, " s");
  }
  if (state.rank == 0 && export_model) {
    log::info("model exported to ", store_.export_folder(state.step).string());
  }
}

std::vector<std::int64_t> Checkpointer::take_completed() {
  std::lock_guard<std::mutex> lock(completed_mutex_);
  return std::exchange(completed_, {});
}

void Checkpointer::save(std::shared_ptr<const CheckpointState> state, bool checkpoint, bool export_model) {
  wait();
  if (!settings_.async) {
    write_or_keep_failure(*state, checkpoint, export_model);
    return;
  }
  writer_ = std::thread([this, state, checkpoint, export_model] { write_or_keep_failure(*state, checkpoint, export_model); });
}

void Checkpointer::write_or_keep_failure(const CheckpointState& state, bool checkpoint, bool export_model) {
  try {
    write(state, checkpoint, export_model);
  } catch (const std::exception& e) {
    failure_ = std::make_exception_ptr(Error("the save of step " + std::to_string(state.step) + " failed: " + e.what()));
    failed_ = true;
  } catch (...) {
    failure_ = std::make_exception_ptr(Error("the save of step " + std::to_string(state.step) + " failed"));
    failed_ = true;
  }
}

}  // namespace tessera::core
