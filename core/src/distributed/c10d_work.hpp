// The work items of Tessera's c10d communicators (distributed.cpp): how a collective started on a
// process group is waited for, and what it keeps alive until then. Private to the communicators.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/run/communicator.hpp"

namespace tessera::core::c10d_work {

class DoneCollective final : public PendingCollective {
 public:
  void wait() override {}
};

inline c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return c10d::ReduceOp::SUM;
    case ReduceOp::max: return c10d::ReduceOp::MAX;
    case ReduceOp::min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Time spent in wait(), summed over a communicator's collectives (waited on any thread).
class WaitClock {
 public:
  void add(std::chrono::steady_clock::duration d) {
    nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }
  double seconds() const { return static_cast<double>(nanoseconds_.load()) * 1e-9; }

 private:
  std::atomic<std::int64_t> nanoseconds_{0};
};

// A c10d work item. NCCL only takes device tensors, so host tensors given to an NCCL group travel
// through device copies (`staged`): copied back to the caller's tensors once the work is done.
// How wait() waits: Gloo's work runs on the host, so waiting is the host blocking until it is
// done. An NCCL work's plain wait() only orders the caller's current CUDA stream after it and
// returns at once (a lost rank is then caught by the next host collective or NCCL's watchdog);
// `host_wait` makes the host block until it is done, throwing after that long, which staged
// results need before they are copied back.
class C10dCollective final : public PendingCollective {
 public:
  C10dCollective(c10::intrusive_ptr<c10d::Work> work, std::int64_t rank, WaitClock* clock,
                 std::vector<std::pair<at::Tensor, at::Tensor>> staged = {},
                 std::optional<std::chrono::milliseconds> host_wait = std::nullopt)
      : work_(std::move(work)), rank_(rank), clock_(clock), staged_(std::move(staged)), host_wait_(host_wait) {}
  void wait() override {
    if (!work_) return;
    try {
      const auto start = std::chrono::steady_clock::now();
      if (host_wait_) {
        work_->wait(*host_wait_);
      } else {
        work_->wait();
      }
      if (clock_) clock_->add(std::chrono::steady_clock::now() - start);
    } catch (const c10::Error& e) {
      throw Error(failure(e.what_without_backtrace()));
    } catch (const std::exception& e) {
      throw Error(failure(e.what()));
    }
    work_.reset();
    for (auto& [host, device] : staged_) host.copy_(device);
    staged_.clear();
  }

 private:
  std::string failure(const std::string& cause) const {
    return "rank " + std::to_string(rank_) + ": a collective failed (another rank exited, or " +
           "settings.collective_timeout_s passed without it): " + cause;
  }
  c10::intrusive_ptr<c10d::Work> work_;
  std::int64_t rank_;
  WaitClock* clock_;  // the communicator's; it outlives its collectives
  std::vector<std::pair<at::Tensor, at::Tensor>> staged_;
  std::optional<std::chrono::milliseconds> host_wait_;
};

// A collective whose result arrives in one flat tensor and is then copied out in parts (an
// all-to-all's outputs), keeping its inputs alive until then.
class SplitResult final : public PendingCollective {
 public:
  SplitResult(std::shared_ptr<PendingCollective> inner, at::Tensor flat, std::vector<at::Tensor> outputs,
              std::vector<std::int64_t> splits, at::Tensor input)
      : inner_(std::move(inner)), flat_(std::move(flat)), outputs_(std::move(outputs)), splits_(std::move(splits)),
        input_(std::move(input)) {}
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      outputs_[i].copy_(flat_.narrow(0, offset, splits_[i]).view(outputs_[i].sizes()));
      offset += splits_[i];
    }
    flat_ = input_ = at::Tensor();
  }

 private:
  std::shared_ptr<PendingCollective> inner_;
  at::Tensor flat_;
  std::vector<at::Tensor> outputs_;  // the caller's tensors (handles to the same storage)
  std::vector<std::int64_t> splits_;
  at::Tensor input_;
};

// A collective whose tensors must outlive the call that started it (a send of a staged copy).
class KeepingAlive final : public PendingCollective {
 public:
  KeepingAlive(std::shared_ptr<PendingCollective> inner, std::vector<at::Tensor> tensors)
      : inner_(std::move(inner)), tensors_(std::move(tensors)) {}
  void wait() override {
    inner_->wait();
    tensors_.clear();
  }

 private:
  std::shared_ptr<PendingCollective> inner_;
  std::vector<at::Tensor> tensors_;
};

}  // namespace tessera::core::c10d_work
