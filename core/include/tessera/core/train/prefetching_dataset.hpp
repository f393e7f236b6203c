// A dataset that reads ahead: a background thread keeps up to `depth` micro-batches of the
// inner dataset ready (trainer.prefetch), in pinned host memory when the run is on a GPU, so
// the step's copy to the device can be asynchronous and reading overlaps computing.
//
// Its state is the inner dataset's state before the first batch the trainer has not taken:
// every queued batch carries the state read just before it was made. A checkpoint therefore
// resumes at exactly the next batch the trainer would have used, however far ahead the
// thread had read. The inner dataset is touched by one thread at a time (the reader while it
// runs, the caller while it is stopped), so datasets need no locking of their own; they must
// not draw from the global random generator, which the training thread uses meanwhile.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "tessera/run/batch.hpp"
#include "tessera/components/dataset.hpp"

namespace tessera::core {

class PrefetchingDataset final : public Dataset {
 public:
  // `pin_memory`: batches are copied to page-locked memory (only when the device is CUDA).
  PrefetchingDataset(std::shared_ptr<Dataset> inner, std::int64_t depth, bool pin_memory);
  ~PrefetchingDataset() override;

  void set_shard(std::int64_t rank, std::int64_t world_size) override;
  Batch next_batch(std::int64_t batch_size) override;
  std::int64_t seq_len() const override { return inner_->seq_len(); }
  std::int64_t num_samples() const override { return inner_->num_samples(); }
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  const Dataset& inner() const { return *inner_; }

 private:
  struct Ready {
    StateDict state_before;  // the inner dataset's state before this batch
    Batch batch;
    std::exception_ptr error;  // reading failed: rethrown when the batch is taken
  };

  void start(std::int64_t batch_size);
  void join_reader();  // the reader finishes its batch and exits
  void stop();         // join_reader(), then the inner dataset rewinds past what was read ahead
  void read_ahead(std::int64_t batch_size);
  // The inner dataset back to the state before `first_not_taken` (the reader stopped).
  void rewind(const Ready& first_not_taken);

  std::shared_ptr<Dataset> inner_;
  std::int64_t depth_;
  bool pin_memory_;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::deque<Ready> queue_;
  bool stopping_ = false;
  std::int64_t batch_size_ = 0;  // of the running reader; 0: none
  std::thread reader_;
};

}  // namespace tessera::core
