// Writes checkpoints and model exports, in the background when asked: the trainer hands over
// host copies taken at a step boundary and keeps training while a thread writes them. At most
// one save is in flight; the next save, and the end of training, wait for it.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/checkpoint/checkpoint_settings.hpp"
#include "tessera/core/checkpoint/checkpoint_state.hpp"
#include "tessera/core/checkpoint/checkpoint_store.hpp"

namespace tessera::core {

class Checkpointer {
 public:
  // `store`: where checkpoints and exports go. `timeout`: how long rank 0 waits for the other
  // ranks' files.
  Checkpointer(CheckpointSettings settings, CheckpointStore store, std::chrono::milliseconds timeout);
  ~Checkpointer();

  const CheckpointSettings& settings() const { return settings_; }
  const CheckpointStore& store() const { return store_; }
  // Writes `state` as a checkpoint and/or a model export (in the background when async); waits
  // for the previous save first, rethrowing its failure. A failure of this save's writing is
  // kept for wait() and failed(), in both modes, so that the ranks can agree on it.
  void save(std::shared_ptr<const CheckpointState> state, bool checkpoint, bool export_model);
  // Waits for the save in flight; rethrows its failure.
  void wait();
  // Whether the last save failed (without waiting for one in flight).
  bool failed() const { return failed_.load(); }
  // Checkpoints whose files this rank finished writing since the last call (for the
  // checkpoint-saved event): their steps, oldest first.
  std::vector<std::int64_t> take_completed();

 private:
  void write(const CheckpointState& state, bool checkpoint, bool export_model);
  void write_or_keep_failure(const CheckpointState& state, bool checkpoint, bool export_model);

  CheckpointSettings settings_;
  CheckpointStore store_;
  std::chrono::milliseconds timeout_;
  std::thread writer_;
  std::exception_ptr failure_;
  std::atomic<bool> failed_{false};
  std::mutex completed_mutex_;
  std::vector<std::int64_t> completed_;
};

}  // namespace tessera::core
