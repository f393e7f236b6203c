// The communicators of a run: local (a world of one), Gloo, and NCCL with a Gloo group beside it
// for host numbers; over c10d process groups after a TCPStore rendezvous. Which rank this process
// is comes from distributed_env.cpp.
#include "tessera/core/distributed/distributed.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <optional>

#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "c10d_work.hpp"

namespace tessera::core {
namespace {

using c10d_work::C10dCollective;
using c10d_work::DoneCollective;
using c10d_work::KeepingAlive;
using c10d_work::SplitResult;
using c10d_work::to_c10d;
using c10d_work::WaitClock;

// A lost rank surfaces as an exception from wait() (the process group's timeout), not a hang.
// An NCCL run also has a Gloo group (`host_backend`): the trainer's per-step host numbers (token
// counts, skip and stop flags) are all-reduced there, on the host alone, instead of being copied
// to the device, reduced by NCCL and copied back, which makes the host wait for all the work
// queued on the device before it (travels_on_host_group says which collectives go there).
class C10dCommunicator final : public Communicator {
 public:
  // `device`: where an NCCL group needs its tensors; CPU for Gloo, which takes them as they are.
  // `timeout`: how long the host waits for an NCCL collective whose result it reads.
  // `store`: the rendezvous the groups of a device mesh are made on (make_subgroup).
  C10dCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend, std::int64_t rank,
                   std::int64_t world, c10::Device device, std::chrono::milliseconds timeout,
                   c10::intrusive_ptr<c10d::Backend> host_backend = {})
      : store_(std::move(store)),
        backend_(std::move(backend)),
        host_backend_(std::move(host_backend)),
        rank_(rank),
        world_(world),
        device_(device),
        timeout_(timeout) {}

  std::int64_t rank() const override { return rank_; }
  std::int64_t world_size() const override { return world_; }
  double wait_seconds() const override { return clock_.seconds(); }
  std::int64_t bytes_communicated() const override { return bytes_.load(); }

  std::shared_ptr<PendingCollective> all_reduce_async(at::Tensor& tensor, ReduceOp op) override {
    check_open();
    count({tensor});
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    if (on_host_group({tensor})) {
      std::vector<at::Tensor> tensors{tensor};
      return pending(host_backend_->allreduce(tensors, options));
    }
    Staging staging = staging_on(device_);
    std::vector<at::Tensor> tensors{staging.in_out(tensor)};
    return staging.pending(backend_->allreduce(tensors, options));
  }
  std::shared_ptr<PendingCollective> all_gather_async(std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    check_open();
    count(outputs);
    std::vector<at::Tensor> all = outputs;
    all.push_back(input);
    const bool host = on_host_group(all);
    Staging staging = staging_on(host ? c10::Device(c10::kCPU) : device_);
    std::vector<std::vector<at::Tensor>> out(1);
    for (auto& o : outputs) out[0].push_back(staging.in_out(o));
    std::vector<at::Tensor> in{staging.in(input)};
    return staging.pending((host ? host_backend_ : backend_)->allgather(out, in));
  }
  std::shared_ptr<PendingCollective> reduce_scatter_async(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                                          ReduceOp op) override {
    check_open();
    count(inputs);
    std::vector<at::Tensor> all = inputs;
    all.push_back(output);
    const bool host = on_host_group(all);
    Staging staging = staging_on(host ? c10::Device(c10::kCPU) : device_);
    std::vector<at::Tensor> out{staging.in_out(output)};
    std::vector<std::vector<at::Tensor>> in(1);
    for (auto& i : inputs) in[0].push_back(staging.in(i));
    c10d::ReduceScatterOptions options;
    options.reduceOp = to_c10d(op);
    return staging.pending((host ? host_backend_ : backend_)->reduce_scatter(out, in, options));
  }
  std::shared_ptr<PendingCollective> all_to_all_async(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs) override {
    check_open();
    if (static_cast<std::int64_t>(outputs.size()) != world_ || static_cast<std::int64_t>(inputs.size()) != world_) {
      throw Error("all_to_all: one tensor per rank in each list (" + std::to_string(world_) + " ranks)");
    }
    count(inputs);
    // As one flat exchange with split sizes (Gloo has no list form): rank r's part of the input
    // goes to rank r, and the output's parts come back in rank order.
    std::vector<std::int64_t> in_splits, out_splits;
    std::vector<at::Tensor> flat_in;
    for (const auto& t : inputs) {
      flat_in.push_back(t.reshape({-1}));
      in_splits.push_back(t.numel());
    }
    for (const auto& t : outputs) out_splits.push_back(t.numel());
    Staging staging = staging_on(device_);
    at::Tensor in = staging.in(at::cat(flat_in));
    at::Tensor out = at::empty({std::accumulate(out_splits.begin(), out_splits.end(), std::int64_t{0})},
                               in.options());
    c10d::AllToAllOptions a2a;
    // c10d takes the split sizes by reference and Gloo's work moves them away: give it copies.
    std::vector<std::int64_t> out_counts = out_splits, in_counts = in_splits;
    auto work = backend_->alltoall_base(out, in, out_counts, in_counts, a2a);
    // Outputs elsewhere than the group's device (host tensors given to NCCL) are copied from the
    // result once it is there: the host waits for it, with the timeout.
    const bool copied_elsewhere =
        !device_.is_cpu() && std::any_of(outputs.begin(), outputs.end(), [&](const at::Tensor& t) { return t.device() != device_; });
    std::shared_ptr<PendingCollective> inner =
        copied_elsewhere ? std::make_shared<C10dCollective>(std::move(work), rank_, &clock_,
                                                            std::vector<std::pair<at::Tensor, at::Tensor>>{}, timeout_)
                         : pending(std::move(work));
    return std::make_shared<SplitResult>(std::move(inner), out, outputs, out_splits, in);
  }
  std::shared_ptr<PendingCollective> send_async(at::Tensor& tensor, std::int64_t peer, int tag) override {
    check_open();
    count({tensor});
    Staging staging = staging_on(device_);
    std::vector<at::Tensor> tensors{staging.in(tensor.contiguous())};
    return std::make_shared<KeepingAlive>(pending(backend_->send(tensors, static_cast<int>(peer), tag)), tensors);
  }
  std::shared_ptr<PendingCollective> recv_async(at::Tensor& tensor, std::int64_t peer, int tag) override {
    check_open();
    count({tensor});
    Staging staging = staging_on(device_);
    std::vector<at::Tensor> tensors{staging.in_out(tensor)};
    return staging.pending(backend_->recv(tensors, static_cast<int>(peer), tag));
  }
  void broadcast(at::Tensor& tensor, std::int64_t root) override {
    check_open();
    count({tensor});
    const bool host = on_host_group({tensor});
    Staging staging = staging_on(host ? c10::Device(c10::kCPU) : device_);
    std::vector<at::Tensor> tensors{staging.in_out(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    staging.pending((host ? host_backend_ : backend_)->broadcast(tensors, options))->wait();
  }
  // On the host group where there is one: NCCL's barrier is a device all-reduce and a device
  // synchronisation.
  void barrier() override {
    check_open();
    C10dCollective((host_backend_ ? host_backend_ : backend_)->barrier(), rank_, &clock_).wait();
  }

  // The communicator of the ranks `members` (ranks of this one, ascending; this rank among them),
  // on this one's store under `name`: the same backend, its own process group.
  std::shared_ptr<Communicator> subgroup(const std::string& name, const std::vector<std::int64_t>& members) {
    const auto mine = std::find(members.begin(), members.end(), rank_);
    if (mine == members.end()) throw Error("subgroup " + name + ": rank " + std::to_string(rank_) + " is not a member");
    const int rank = static_cast<int>(mine - members.begin()), size = static_cast<int>(members.size());
    auto store = c10::make_intrusive<c10d::PrefixStore>(name, store_);
    c10::intrusive_ptr<c10d::Backend> backend, host_backend;
    if (host_backend_) {
#ifdef USE_C10D_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout_ + std::chrono::minutes(1);
      backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
      host_backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("host_group", store), rank, size,
          c10d::ProcessGroupGloo::Options::create_default(timeout_));
#endif
    } else {
      backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size,
                                                            c10d::ProcessGroupGloo::Options::create_default(timeout_));
    }
    auto group = std::make_shared<C10dCommunicator>(store, backend, rank, size, device_, timeout_, host_backend);
    subgroups_.push_back(group);
    return group;
  }

  // See shut_down() in distributed.hpp.
  void shut_down() {
    if (closed_) return;
    closed_ = true;
    // The run's results are saved by now: a failure here is reported, not made the run's.
    for (auto& group : subgroups_) {
      if (auto alive = group.lock()) alive->shut_down();
    }
    try {
      backend_->shutdown();
      if (host_backend_) host_backend_->shutdown();
    } catch (const std::exception& e) {
      log::warn("rank ", rank_, ": shutting the process group down failed: ", e.what());
    }
  }

 private:
  void check_open() const {
    if (closed_) {
      throw Error("rank " + std::to_string(rank_) +
                  ": a collective was started after the run shut its process group down");
    }
  }
  void count(const std::vector<at::Tensor>& tensors) {
    std::int64_t bytes = 0;
    for (const auto& t : tensors) bytes += static_cast<std::int64_t>(t.nbytes());
    bytes_ += bytes;
  }
  bool on_host_group(const std::vector<at::Tensor>& tensors) const {
    return host_backend_ && travels_on_host_group(tensors);
  }
  std::shared_ptr<PendingCollective> pending(c10::intrusive_ptr<c10d::Work> work) {
    return std::make_shared<C10dCollective>(std::move(work), rank_, &clock_);
  }

  // Moves host tensors to an NCCL group's device and remembers which to copy back.
  class Staging {
   public:
    Staging(c10::Device device, std::int64_t rank, WaitClock* clock, std::chrono::milliseconds timeout)
        : device_(device), rank_(rank), clock_(clock), timeout_(timeout) {}
    at::Tensor in(const at::Tensor& t) { return needs_copy(t) ? t.to(device_) : t; }
    at::Tensor in_out(const at::Tensor& t) {
      if (!needs_copy(t)) return t;
      at::Tensor d = t.to(device_);
      staged_.emplace_back(t, d);
      return d;
    }
    // The host reads staged results, so it waits for the device to finish them.
    std::shared_ptr<PendingCollective> pending(c10::intrusive_ptr<c10d::Work> work) {
      std::optional<std::chrono::milliseconds> host_wait;
      if (!staged_.empty()) host_wait = timeout_;
      return std::make_shared<C10dCollective>(std::move(work), rank_, clock_, std::move(staged_), host_wait);
    }

   private:
    bool needs_copy(const at::Tensor& t) const { return !device_.is_cpu() && t.device() != device_; }
    c10::Device device_;
    std::int64_t rank_;
    WaitClock* clock_;
    std::chrono::milliseconds timeout_;
    std::vector<std::pair<at::Tensor, at::Tensor>> staged_;
  };
  // A collective's staging on `device` (the host for the Gloo group).
  Staging staging_on(c10::Device device) { return Staging(device, rank_, &clock_, timeout_); }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  c10::intrusive_ptr<c10d::Backend> host_backend_;  // null: every collective on backend_
  std::vector<std::weak_ptr<C10dCommunicator>> subgroups_;  // shut down with this one
  std::int64_t rank_, world_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
  WaitClock clock_;
  std::atomic<std::int64_t> bytes_{0};  // bytes_communicated()
  bool closed_ = false;
};

c10::intrusive_ptr<c10d::Store> rendezvous(const DistributedEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(env.world_size);
  store_options.waitWorkers = true;
  store_options.timeout = timeout;
  if (env.rank == 0 && env.store_listen_fd) store_options.masterListenFd = *env.store_listen_fd;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + ": rendezvous at " + env.master_addr + ":" +
                std::to_string(env.master_port) + " failed: " + e.what());
  }
}

c10::intrusive_ptr<c10d::Backend> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const DistributedEnv& env,
                                             std::chrono::milliseconds timeout) {
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(env.rank), static_cast<int>(env.world_size),
                                                     c10d::ProcessGroupGloo::Options::create_default(timeout));
}

}  // namespace

bool travels_on_host_group(const std::vector<at::Tensor>& tensors) {
  std::int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.device().is_cpu()) return false;
    bytes += static_cast<std::int64_t>(t.nbytes());
  }
  return bytes <= kHostGroupMaxBytes;
}

std::shared_ptr<Communicator> make_local_communicator() { return make_single_rank_communicator(); }

std::shared_ptr<Communicator> make_gloo_communicator(const DistributedEnv& env, std::chrono::milliseconds timeout) {
  auto store = rendezvous(env, timeout);
  return std::make_shared<C10dCommunicator>(store, gloo_group(store, env, timeout), env.rank, env.world_size,
                                            c10::Device(c10::kCPU), timeout);
}

std::shared_ptr<Communicator> make_subgroup(Communicator& world, const std::string& name,
                                            const std::vector<std::int64_t>& members) {
  auto* c10d = dynamic_cast<C10dCommunicator*>(&world);
  if (!c10d) throw Error("make_subgroup: " + name + " needs a communicator over c10d");
  return c10d->subgroup(name, members);
}

void shut_down(Communicator& comm) {
  if (auto* c10d = dynamic_cast<C10dCommunicator*>(&comm)) c10d->shut_down();
}

bool nccl_available() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

std::shared_ptr<Communicator> make_nccl_communicator(const DistributedEnv& env, std::chrono::milliseconds timeout,
                                                     c10::Device device) {
#ifdef USE_C10D_NCCL
  if (!device.is_cuda() || !device.has_index()) {
    throw Error("NCCL needs a CUDA device with an index, got " + device.str());
  }
  // One device per local rank: the group's communicators and streams belong to this device.
  c10::cuda::set_device(device.index());
  // Waits stay stream-ordered (TORCH_NCCL_BLOCKING_WAIT unset): waiting for a gradient bucket or
  // a gather must not hold the host until the GPU has done it. A rank lost in a device collective
  // is caught by the next step's host collective on the Gloo group, which has the timeout, or by
  // NCCL's watchdog (docs/distributed.md).
  auto store = rendezvous(env, timeout);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  // NCCL's watchdog aborts the process (SIGABRT) when a collective passes this. It is the last
  // resort: a minute later than the Gloo group's timeout, whose error ends a run cleanly first.
  options->timeout = timeout + std::chrono::minutes(1);
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(env.rank),
                                                             static_cast<int>(env.world_size), options);
  // The Gloo group for host tensors, on its own keys of the same store.
  auto host_backend = gloo_group(c10::make_intrusive<c10d::PrefixStore>("host_group", store), env, timeout);
  return std::make_shared<C10dCommunicator>(store, backend, env.rank, env.world_size, device, timeout, host_backend);
#else
  (void)env, (void)timeout;
  throw Error("this Tessera was built without NCCL (LibTorch without USE_C10D_NCCL); cannot use " + device.str());
#endif
}

}  // namespace tessera::core
