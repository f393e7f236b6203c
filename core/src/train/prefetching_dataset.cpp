#include "tessera/core/train/prefetching_dataset.hpp"

#include "tessera/error.hpp"
#include "tessera/log.hpp"

namespace tessera::core {

PrefetchingDataset::PrefetchingDataset(std::shared_ptr<Dataset> inner, std::int64_t depth, bool pin_memory)
    : inner_(std::move(inner)), depth_(depth), pin_memory_(pin_memory) {
  if (!inner_) throw Error("prefetch: no dataset to read ahead of");
  if (depth_ < 1) throw Error("prefetch: depth must be at least 1, got " + std::to_string(depth_));
}

PrefetchingDataset::~PrefetchingDataset() { join_reader(); }

void PrefetchingDataset::set_shard(std::int64_t rank, std::int64_t world_size) {
  stop();
  inner_->set_shard(rank, world_size);
}

void PrefetchingDataset::start(std::int64_t batch_size) {
  stopping_ = false;
  reader_ = std::thread([this, batch_size] { read_ahead(batch_size); });
  batch_size_ = batch_size;  // only once a reader runs: state_dict() waits on it
}

void PrefetchingDataset::join_reader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (reader_.joinable()) reader_.join();
}

void PrefetchingDataset::stop() {
  join_reader();
  batch_size_ = 0;  // first: no reader runs from here on, even if the rewind below throws
  // What was read ahead is dropped: the inner dataset rewinds to the first batch not taken.
  if (!queue_.empty()) {
    Ready first = std::move(queue_.front());
    queue_.clear();
    rewind(first);
  }
}

void PrefetchingDataset::rewind(const Ready& first_not_taken) {
  // An empty state: reading the state itself failed, before the inner dataset read anything.
  if (!first_not_taken.state_before.empty()) inner_->load_state_dict(first_not_taken.state_before);
}

void PrefetchingDataset::read_ahead(std::int64_t batch_size) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || static_cast<std::int64_t>(queue_.size()) < depth_; });
      if (stopping_) return;
    }
    Ready ready;
    try {
      ready.state_before = inner_->state_dict();
      ready.batch = inner_->next_batch(batch_size);
      if (pin_memory_) {
        ready.batch.input_ids = ready.batch.input_ids.pin_memory();
        ready.batch.labels = ready.batch.labels.pin_memory();
        if (ready.batch.document_ids.defined()) ready.batch.document_ids = ready.batch.document_ids.pin_memory();
      }
    } catch (...) {
      ready.error = std::current_exception();
    }
    const bool failed = static_cast<bool>(ready.error);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(ready));
    }
    changed_.notify_all();
    if (failed) return;  // the error reaches the trainer with the batch it would have been
  }
}

Batch PrefetchingDataset::next_batch(std::int64_t batch_size) {
  if (batch_size != batch_size_) {
    // First call, or another size (an evaluation reading the same dataset): read ahead anew.
    stop();
    start(batch_size);
  }
  Ready ready;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !queue_.empty(); });
    ready = std::move(queue_.front());
    queue_.pop_front();
  }
  changed_.notify_all();
  if (ready.error) {
    // The reader has exited; the next call starts it again from the state before the failure.
    if (reader_.joinable()) reader_.join();
    batch_size_ = 0;
    try {
      rewind(ready);
    } catch (const std::exception& e) {
      // The reading error is the one to report; this one only means the position may be off.
      log::warn("prefetch: after a reading error, rewinding the dataset failed too: ", e.what());
    }
    std::rethrow_exception(ready.error);
  }
  return std::move(ready.batch);
}

StateDict PrefetchingDataset::state_dict() const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (batch_size_ == 0) return inner_->state_dict();  // no reader: the inner dataset is idle
  // The reader is always ahead: the next batch's state arrives with it.
  changed_.wait(lock, [&] { return !queue_.empty(); });
  return queue_.front().state_before;
}

void PrefetchingDataset::load_state_dict(const StateDict& state) {
  stop();
  inner_->load_state_dict(state);
}

}  // namespace tessera::core
