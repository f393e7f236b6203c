#include "tessera/core/distributed.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>

#include "tessera/error.hpp"

namespace tessera::core {
namespace {

const char* first_env(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) return v;
  }
  return nullptr;
}

std::int64_t integer_env(std::initializer_list<const char*> names, std::int64_t fallback) {
  const char* v = first_env(names);
  if (!v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*v == '\0' || *end != '\0') {
    throw ConfigError(std::string("environment variable ") + *names.begin() + " is '" + v + "', not an integer");
  }
  return n;
}

class LocalCommunicator final : public Communicator {
 public:
  std::int64_t rank() const override { return 0; }
  std::int64_t world_size() const override { return 1; }
  void all_reduce(at::Tensor&, ReduceOp) override {}
  void all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    outputs.at(0).copy_(input);
  }
  void reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, ReduceOp) override {
    output.copy_(inputs.at(0));
  }
  void broadcast(at::Tensor&, std::int64_t) override {}
  void barrier() override {}
};

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return c10d::ReduceOp::SUM;
    case ReduceOp::max: return c10d::ReduceOp::MAX;
    case ReduceOp::min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Every call waits for its work: the trainer's steps are synchronous points anyway, and a lost
// rank then surfaces as an exception (the process group's timeout) instead of a hang.
class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<c10d::Backend> backend, std::int64_t rank, std::int64_t world)
      : backend_(std::move(backend)), rank_(rank), world_(world) {}

  std::int64_t rank() const override { return rank_; }
  std::int64_t world_size() const override { return world_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    backend_->allreduce(tensors, options)->wait();
  }
  void all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    std::vector<std::vector<at::Tensor>> out{outputs};
    std::vector<at::Tensor> in{input};
    backend_->allgather(out, in)->wait();
  }
  void reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, ReduceOp op) override {
    std::vector<at::Tensor> out{output};
    std::vector<std::vector<at::Tensor>> in{inputs};
    c10d::ReduceScatterOptions options;
    options.reduceOp = to_c10d(op);
    backend_->reduce_scatter(out, in, options)->wait();
  }
  void broadcast(at::Tensor& tensor, std::int64_t root) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    backend_->broadcast(tensors, options)->wait();
  }
  void barrier() override { backend_->barrier()->wait(); }

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::int64_t rank_, world_;
};

}  // namespace

DistributedEnv read_distributed_env() {
  DistributedEnv env;
  env.world_size = integer_env({"WORLD_SIZE", "SLURM_NTASKS"}, 1);
  env.rank = integer_env({"RANK", "SLURM_PROCID"}, 0);
  env.local_rank = integer_env({"LOCAL_RANK", "SLURM_LOCALID"}, 0);
  if (const char* addr = first_env({"MASTER_ADDR"})) env.master_addr = addr;
  env.master_port = static_cast<int>(integer_env({"MASTER_PORT"}, 29500));
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw ConfigError("RANK " + std::to_string(env.rank) + " is not in a world of WORLD_SIZE " +
                      std::to_string(env.world_size));
  }
  if (env.master_port <= 0 || env.master_port > 65535) {
    throw ConfigError("MASTER_PORT " + std::to_string(env.master_port) + " is not a port number");
  }
  return env;
}

std::shared_ptr<Communicator> make_local_communicator() { return std::make_shared<LocalCommunicator>(); }

std::shared_ptr<Communicator> make_gloo_communicator(const DistributedEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(env.world_size);
  store_options.waitWorkers = true;
  store_options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + ": rendezvous at " + env.master_addr + ":" +
                std::to_string(env.master_port) + " failed: " + e.what());
  }
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(env.rank),
                                                             static_cast<int>(env.world_size), options);
  return std::make_shared<C10dCommunicator>(backend, env.rank, env.world_size);
}

}  // namespace tessera::core
