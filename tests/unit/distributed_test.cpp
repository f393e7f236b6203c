// The c10d-backed communicator: two ranks as two threads of this process, rendezvous over a real
// TCPStore on loopback and a real Gloo process group; and reading ranks from the environment.
#include "tessera/core/distributed/distributed.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <thread>

#include "gloo_ranks.hpp"
#include "tessera/error.hpp"

namespace tessera::core {
namespace distributed_test {

struct RankResult {
  std::vector<at::Tensor> gathered;
  at::Tensor scattered, broadcast, maxed;
  std::string error;
};

void run_rank(DistributedEnv env, RankResult& out) {
  try {
    auto comm = make_gloo_communicator(env, std::chrono::seconds(30));
    ASSERT_EQ(comm->rank(), env.rank);
    ASSERT_EQ(comm->world_size(), 2);
    const double r = static_cast<double>(env.rank);
    at::Tensor mine = at::full({3}, r + 1);
    out.gathered = {at::zeros({3}), at::zeros({3})};
    comm->all_gather(out.gathered, mine);
    // inputs[j] = (rank + 1) * (j + 1): rank j receives the sum over ranks, 3 * (j + 1).
    std::vector<at::Tensor> inputs = {at::full({2}, (r + 1) * 1), at::full({2}, (r + 1) * 2)};
    out.scattered = at::zeros({2});
    comm->reduce_scatter(out.scattered, inputs);
    out.broadcast = env.rank == 1 ? at::arange(4).to(at::kFloat) : at::zeros({4});
    comm->broadcast(out.broadcast, 1);
    out.maxed = at::full({1}, r * 10);
    comm->all_reduce(out.maxed, ReduceOp::max);
    comm->barrier();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

TEST(Distributed, GlooCollectivesAcrossTwoRanks) {
  DistributedEnv env;
  env.world_size = 2;
  env.master_port = testing::free_loopback_port();
  RankResult results[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    DistributedEnv e = env;
    e.rank = r;
    ranks[r] = std::thread(run_rank, e, std::ref(results[r]));
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(results[r].error, "");
    EXPECT_TRUE(results[r].gathered[0].equal(at::full({3}, 1.0)));
    EXPECT_TRUE(results[r].gathered[1].equal(at::full({3}, 2.0)));
    EXPECT_TRUE(results[r].scattered.equal(at::full({2}, 3.0 * (r + 1))));
    EXPECT_TRUE(results[r].broadcast.equal(at::arange(4).to(at::kFloat)));
    EXPECT_EQ(results[r].maxed.item<double>(), 10.0);
  }
}

// tessera launch holds the store's port from the moment it picks it: it binds a listening socket
// and rank 0's store takes it over (DistributedEnv::store_listen_fd). Here the socket is bound
// and listening before either rank starts, so a store that bound the port itself would fail.
TEST(Distributed, RankZerosStoreTakesOverAListeningSocket) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, SOMAXCONN), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  DistributedEnv env;
  env.world_size = 2;
  env.master_port = ntohs(addr.sin_port);
  env.store_listen_fd = fd;
  RankResult results[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    DistributedEnv e = env;
    e.rank = r;
    ranks[r] = std::thread(run_rank, e, std::ref(results[r]));
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(results[r].error, "");
    EXPECT_EQ(results[r].maxed.item<double>(), 10.0);
  }
}

TEST(Distributed, TheStoreSocketComesFromTheEnvironment) {
  ::setenv("TESSERA_STORE_LISTEN_FD", "7", 1);
  EXPECT_EQ(read_distributed_env().store_listen_fd, std::optional<int>(7));
  ::setenv("TESSERA_STORE_LISTEN_FD", "x", 1);
  EXPECT_THROW(read_distributed_env(), ConfigError);
  ::unsetenv("TESSERA_STORE_LISTEN_FD");
  EXPECT_FALSE(read_distributed_env().store_listen_fd.has_value());
}

// An NCCL run's communicator sends a collective over its Gloo group when every tensor is on the
// host and they are small: the trainer's counts and flags, never a gradient or a large host copy.
// (The meta device stands in for a GPU: what matters is "not the host".)
TEST(Distributed, OnlySmallHostTensorsTravelOnTheHostGroup) {
  const auto opts = at::TensorOptions().dtype(at::kLong);
  EXPECT_TRUE(travels_on_host_group({at::zeros({3}, opts)}));
  EXPECT_TRUE(travels_on_host_group({at::zeros({2}, opts), at::zeros({2}, opts)}));
  EXPECT_TRUE(travels_on_host_group({at::zeros({kHostGroupMaxBytes / 8}, opts)}));
  EXPECT_FALSE(travels_on_host_group({at::zeros({kHostGroupMaxBytes / 8 + 1}, opts)}));
  EXPECT_FALSE(travels_on_host_group({at::zeros({kHostGroupMaxBytes / 16 + 1}, opts), at::zeros({kHostGroupMaxBytes / 16}, opts)}));
  EXPECT_FALSE(travels_on_host_group({at::zeros({3}, opts.device(c10::kMeta))}));
  EXPECT_FALSE(travels_on_host_group({at::zeros({3}, opts), at::zeros({3}, opts.device(c10::kMeta))}));
}

TEST(Distributed, NcclIsBuiltWhenLibTorchHasIt) {
  // CI has no GPU, but the NCCL process group must compile and link wherever LibTorch has it.
#ifdef USE_C10D_NCCL
  EXPECT_TRUE(nccl_available());
#else
  EXPECT_FALSE(nccl_available());
#endif
  if (!nccl_available()) GTEST_SKIP() << "this LibTorch has no NCCL";
  // Without a GPU the NCCL path refuses a device that is not CUDA with a clear error.
  DistributedEnv env;
  env.world_size = 2;
  try {
    make_nccl_communicator(env, std::chrono::seconds(1), c10::Device(c10::kCPU));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL needs a CUDA device"), std::string::npos) << e.what();
  }
}

TEST(Distributed, AsyncCollectivesCompleteInOrder) {
  DistributedEnv env;
  env.world_size = 2;
  env.master_port = testing::free_loopback_port();
  std::string errors[2];
  at::Tensor results[2][3];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      try {
        DistributedEnv e = env;
        e.rank = r;
        auto comm = make_gloo_communicator(e, std::chrono::seconds(30));
        // Three collectives in flight at once, waited for in reverse.
        for (int i = 0; i < 3; ++i) results[r][i] = at::full({1000}, static_cast<double>((r + 1) * (i + 1)));
        std::vector<std::shared_ptr<PendingCollective>> pending;
        for (int i = 0; i < 3; ++i) pending.push_back(comm->all_reduce_async(results[r][i]));
        for (int i = 2; i >= 0; --i) pending[static_cast<size_t>(i)]->wait();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "");
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(results[r][i].equal(at::full({1000}, 3.0 * (i + 1)))) << r << " " << i;
  }
}

// A run that ended shuts its process groups down (an NCCL group then destroys its communicators
// instead of aborting them at exit); a collective started afterwards is refused with an error
// saying why, on every kind of collective, rather than reaching a group that is gone.
TEST(Distributed, CollectivesAfterShutDownAreRefused) {
  const auto errors = testing::run_on_gloo_ranks(2, [](std::int64_t rank, std::shared_ptr<Communicator> comm) {
    at::Tensor t = at::full({2}, static_cast<double>(rank + 1));
    comm->all_reduce(t);
    EXPECT_TRUE(t.equal(at::full({2}, 3.0)));
    comm->barrier();
    shut_down(*comm);
    shut_down(*comm);  // a second time does nothing
    std::vector<at::Tensor> gathered = {at::zeros({2}), at::zeros({2})};
    std::vector<at::Tensor> inputs = {t, t};
    const std::vector<std::function<void()>> collectives = {
        [&] { comm->all_reduce(t); },
        [&] { comm->all_gather(gathered, t); },
        [&] { comm->reduce_scatter(t, inputs); },
        [&] { comm->broadcast(t, 0); },
        [&] { comm->barrier(); },
    };
    for (std::size_t i = 0; i < collectives.size(); ++i) {
      try {
        collectives[i]();
        ADD_FAILURE() << "collective " << i << " started after the shut down";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("after the run shut its process group down"), std::string::npos)
            << e.what();
      }
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(Distributed, LocalCommunicatorIsAWorldOfOne) {
  auto comm = make_local_communicator();
  EXPECT_EQ(comm->world_size(), 1);
  at::Tensor t = at::full({2}, 5.0);
  comm->all_reduce(t);
  EXPECT_TRUE(t.equal(at::full({2}, 5.0)));
  std::vector<at::Tensor> out = {at::zeros({2})};
  comm->all_gather(out, t);
  EXPECT_TRUE(out[0].equal(t));
}

class DistributedEnvironment : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* n : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                          "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_LAUNCH_NODE_IPADDR"}) {
      ::unsetenv(n);
    }
  }
};

TEST_F(DistributedEnvironment, TorchrunVariables) {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "10.1.2.3", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  DistributedEnv env = read_distributed_env();
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 1234);
}

TEST_F(DistributedEnvironment, SlurmVariablesWhenTorchrunsAreAbsent) {
  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_NTASKS", "3", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_LAUNCH_NODE_IPADDR", "10.0.0.5", 1);
  DistributedEnv env = read_distributed_env();
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.5");
  ::setenv("MASTER_ADDR", "10.0.0.9", 1);
  EXPECT_EQ(read_distributed_env().master_addr, "10.0.0.9") << "MASTER_ADDR wins";
}

TEST_F(DistributedEnvironment, NothingSetIsAWorldOfOneAndBadValuesAreErrors) {
  EXPECT_EQ(read_distributed_env().world_size, 1);
  ::setenv("WORLD_SIZE", "two", 1);
  EXPECT_THROW(read_distributed_env(), ConfigError);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "2", 1);
  EXPECT_THROW(read_distributed_env(), ConfigError);
}

// Sets environment variables for one test and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : kLaunchVariables) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  static constexpr const char* kLaunchVariables[] = {
      "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
      "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
      "SLURM_LAUNCH_NODE_IPADDR", "CUDA_VISIBLE_DEVICES"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(DeviceForRank, CudaIsOneGpuPerLocalRank) {
  DistributedEnv env;
  env.local_rank = 3;
  env.local_world_size = 4;
  EXPECT_EQ(device_for_rank("cuda", env), "cuda:3");
  EXPECT_EQ(device_for_rank("cpu", env), "cpu");
  env.visible_gpus = std::vector<std::string>{"0", "1", "2", "3"};
  EXPECT_EQ(device_for_rank("cuda", env), "cuda:3");
  // A launcher's ranks restricted to one GPU keep their local rank: rank 3 then names a GPU
  // the process cannot see, which the run reports, rather than sharing cuda:0 unnoticed.
  env.visible_gpus = std::vector<std::string>{"3"};
  EXPECT_EQ(device_for_rank("cuda", env), "cuda:3");
}

TEST(DeviceForRank, AnExplicitGpuWithSeveralLocalRanksIsAnError) {
  DistributedEnv env;
  env.local_world_size = 2;
  try {
    device_for_rank("cuda:1", env);
    FAIL() << "two ranks on one GPU must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("this node runs 2 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Set device: cuda"), std::string::npos) << e.what();
  }
  env.local_world_size = 1;
  EXPECT_EQ(device_for_rank("cuda:1", env), "cuda:1");  // one rank may pick its GPU
}

// srun with --gpus-per-task=1: every task sees one GPU (its own) as device 0, whatever its
// SLURM_LOCALID, and the ranks come from Slurm's variables.
TEST(DeviceForRank, SlurmWithOneVisibleGpuPerTaskBindsEachRankToIt) {
  ScopedEnv slurm({{"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "4"},
                   {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"CUDA_VISIBLE_DEVICES", "1"}});
  const DistributedEnv env = read_distributed_env();
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_TRUE(env.slurm_task);
  EXPECT_EQ(device_for_rank("cuda", env), "cuda:0");
  EXPECT_EQ(device_for_rank("cuda:0", env), "cuda:0");  // its one GPU, named
  EXPECT_THROW(device_for_rank("cuda:1", env), ConfigError);
}

TEST(DeviceForRank, SlurmWithEveryGpuVisibleUsesTheLocalId) {
  ScopedEnv slurm({{"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "8"},
                   {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}});
  const DistributedEnv env = read_distributed_env();
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(device_for_rank("cuda", env), "cuda:1");
  EXPECT_THROW(device_for_rank("cuda:0", env), ConfigError);
}

}  // namespace distributed_test
}  // namespace tessera::core
