// Several ranks in one test process: each a thread with its own real Gloo process group over a
// TCPStore on 127.0.0.1, as separate processes would have.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/run/context.hpp"
#include "tessera/core/distributed/distributed.hpp"

namespace tessera::testing {

// The RunContext of one rank: its communicator, rank and world size, and the run's seed.
inline RunContext rank_context(const std::shared_ptr<Communicator>& comm, std::uint64_t seed) {
  RunContext context;
  context.seed = seed;
  context.rank = comm->rank();
  context.world_size = comm->world_size();
  context.communicator = comm;
  return context;
}

// A port free on the loopback interface now, drawn at random below Linux's ephemeral range
// (32768 and up). A port the kernel hands out itself is back in that range once closed, and
// under load another test's Gloo connection could be given it before rank 0's store binds it (seen
// once in CI: the other ranks' rendezvous then timed out).
inline int free_loopback_port() {
  static std::mt19937 draw(std::random_device{}());
  std::uniform_int_distribution<int> ports(10000, 32000);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = ports(draw);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("no free loopback port between 10000 and 32000");
}

// Blocks each thread that arrives until `count` have: a C++17 stand-in for std::latch.
class ThreadLatch {
 public:
  explicit ThreadLatch(std::int64_t count) : left_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (--left_ == 0) {
      all_arrived_.notify_all();
      return;
    }
    all_arrived_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  std::int64_t left_;
};

// Runs body(rank, communicator) on `world` threads; returns each rank's error ("" if none).
// Every rank keeps its group until all bodies have ended: rank 0's group holds the TCPStore's
// server, and a rank whose body ended first (one with no collective in it) would otherwise close
// the store under a rank still reading the others' addresses from it (seen under load: "Gloo
// connectFullMesh failed ... Connection closed by peer").
inline std::vector<std::string> run_on_gloo_ranks(
    std::int64_t world, const std::function<void(std::int64_t, std::shared_ptr<Communicator>)>& body) {
  core::DistributedEnv env;
  env.world_size = world;
  env.master_port = free_loopback_port();
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  ThreadLatch all_done(world);
  std::vector<std::thread> ranks;
  for (std::int64_t r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      std::shared_ptr<Communicator> group;
      try {
        core::DistributedEnv mine = env;
        mine.rank = r;
        group = core::make_gloo_communicator(mine, std::chrono::seconds(60));
        body(r, group);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
      all_done.arrive_and_wait();
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

}  // namespace tessera::testing
