// Which rank this process is and which device it takes: torchrun's variables, or Slurm's where
// those are absent (declared in tessera/core/distributed/distributed.hpp).
#include <cstdlib>
#include <initializer_list>
#include <sstream>
#include <string>

#include "tessera/core/distributed/distributed.hpp"
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

// LOCAL_WORLD_SIZE (tessera launch, torchrun); under srun, the count SLURM_STEP_TASKS_PER_NODE
// gives first ("4(x2)" or "4,3": tasks per node, node by node); else 1.
std::int64_t local_world_size() {
  if (std::getenv("LOCAL_WORLD_SIZE")) return integer_env({"LOCAL_WORLD_SIZE"}, 1);
  if (const char* tasks = first_env({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    const long long n = std::strtoll(tasks, nullptr, 10);
    if (n > 0) return n;
  }
  return 1;
}

}  // namespace

DistributedEnv read_distributed_env() {
  DistributedEnv env;
  env.world_size = integer_env({"WORLD_SIZE", "SLURM_NTASKS"}, 1);
  env.rank = integer_env({"RANK", "SLURM_PROCID"}, 0);
  env.local_rank = integer_env({"LOCAL_RANK", "SLURM_LOCALID"}, 0);
  env.slurm_task = !std::getenv("LOCAL_RANK") && std::getenv("SLURM_LOCALID");
  env.local_world_size = local_world_size();
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    env.visible_gpus.emplace();
    std::stringstream list(visible);
    for (std::string id; std::getline(list, id, ',');) {
      if (!id.empty()) env.visible_gpus->push_back(id);
    }
  }
  // Under srun without MASTER_ADDR: the node srun was started from, where rank 0 usually runs.
  if (const char* addr = first_env({"MASTER_ADDR", "SLURM_LAUNCH_NODE_IPADDR"})) env.master_addr = addr;
  env.master_port = static_cast<int>(integer_env({"MASTER_PORT"}, 29500));
  if (std::getenv("TESSERA_STORE_LISTEN_FD")) {
    const std::int64_t fd = integer_env({"TESSERA_STORE_LISTEN_FD"}, -1);
    if (fd < 0) throw ConfigError("TESSERA_STORE_LISTEN_FD " + std::to_string(fd) + " is not a file descriptor");
    env.store_listen_fd = static_cast<int>(fd);
  }
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw ConfigError("RANK " + std::to_string(env.rank) + " is not in a world of WORLD_SIZE " +
                      std::to_string(env.world_size));
  }
  if (env.master_port <= 0 || env.master_port > 65535) {
    throw ConfigError("MASTER_PORT " + std::to_string(env.master_port) + " is not a port number");
  }
  return env;
}

std::string device_for_rank(const std::string& setting, const DistributedEnv& env) {
  const bool bound_slurm_task = env.slurm_task && env.visible_gpus && env.visible_gpus->size() == 1;
  if (setting.rfind("cuda:", 0) == 0 && env.local_world_size > 1 && !(bound_slurm_task && setting == "cuda:0")) {
    throw ConfigError(setting + " is one GPU, but this node runs " +
                      std::to_string(env.local_world_size) +
                      " ranks: every rank would use it. Set device: cuda (each rank takes cuda:LOCAL_RANK)",
                      "device");
  }
  if (setting != "cuda") return setting;
  if (bound_slurm_task) return "cuda:0";
  return "cuda:" + std::to_string(env.local_rank);
}

}  // namespace tessera::core
