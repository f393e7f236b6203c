// The process group of a run: which rank this process is, read from torchrun-compatible
// variables (or Slurm's), and a Communicator over LibTorch's c10d with TCPStore rendezvous:
// Gloo for CPU runs, NCCL for CUDA runs.
// A world of one needs no variables and makes no connection.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera::core {

struct DistributedEnv {
  std::int64_t rank = 0;
  std::int64_t local_rank = 0;
  std::int64_t world_size = 1;
  std::int64_t local_world_size = 1;  // ranks on this node
  bool slurm_task = false;            // the local rank came from srun (SLURM_LOCALID), not a launcher
  // CUDA_VISIBLE_DEVICES when set: the GPUs this process may use (Slurm's per-task binding
  // leaves one); null when unset (every GPU of the machine).
  std::optional<std::vector<std::string>> visible_gpus;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // TESSERA_STORE_LISTEN_FD: a socket already listening on master_port that rank 0's store
  // takes over (tessera launch binds it, so the port cannot be taken meanwhile).
  std::optional<int> store_listen_fd;
};

// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; else SLURM_PROCID,
// SLURM_LOCALID, SLURM_NTASKS, SLURM_STEP_TASKS_PER_NODE; else a world of one. Throws
// tessera::ConfigError for inconsistent values.
DistributedEnv read_distributed_env();

// The device this rank trains on, from settings.device. "cuda" is one GPU per local rank:
// cuda:LOCAL_RANK; under srun, cuda:0 when the task sees a single GPU (Slurm binding each task
// to its own GPU through CUDA_VISIBLE_DEVICES). An explicit cuda:N with several ranks on the
// node would put them all on one GPU: a ConfigError (except cuda:0 for such a bound Slurm task).
std::string device_for_rank(const std::string& setting, const DistributedEnv& env);

// A world of one: every collective returns at once.
std::shared_ptr<Communicator> make_local_communicator();
// Rendezvous through a TCPStore at master_addr:master_port (rank 0 serves it), then a Gloo
// process group. Every collective throws once `timeout` passes without the other ranks.
std::shared_ptr<Communicator> make_gloo_communicator(const DistributedEnv& env, std::chrono::milliseconds timeout);
// The same rendezvous, then an NCCL process group on `device` (cuda:LOCAL_RANK), which becomes
// this process's current device, and beside it a Gloo group on the same store for small host
// tensors (travels_on_host_group): the trainer's per-step counts and flags never touch the
// device. Larger host tensors are staged through the device for NCCL's bandwidth.
// Waiting for a collective of device tensors orders the current CUDA stream after it and returns
// without waiting for the GPU; waiting for staged host tensors blocks until they are back, and
// throws once `timeout` passes.
std::shared_ptr<Communicator> make_nccl_communicator(const DistributedEnv& env, std::chrono::milliseconds timeout,
                                                     c10::Device device);
// The communicator of the ranks `members` (ranks of `world`, ascending, this rank among them):
// a process group of the world's backend on its store under `name`. Every member must make it,
// and every rank its groups in the same order (their rendezvous is a collective of the members).
std::shared_ptr<Communicator> make_subgroup(Communicator& world, const std::string& name,
                                            const std::vector<std::int64_t>& members);
// The device mesh of `dims` over `world`: a process group for each of the mesh's standard groups
// that has more than one rank and fewer than all (DeviceMesh::standard_groups, made in that
// order). A mesh of data parallelism alone makes none.
std::shared_ptr<DeviceMesh> make_device_mesh(const std::shared_ptr<Communicator>& world, const ParallelDims& dims);
// The same with the groups made by `make_group(name, members)` (tessera plan: communicators that
// know their place and move no data, core/src/plan/layout_mesh.cpp).
using MakeGroup =
    std::function<std::shared_ptr<Communicator>(const std::string& name, const std::vector<std::int64_t>& members)>;
std::shared_ptr<DeviceMesh> make_device_mesh(const std::shared_ptr<Communicator>& world, const ParallelDims& dims,
                                             const MakeGroup& make_group);

// Ends the process groups of a communicator made above, for a run that finished normally: NCCL
// destroys its communicators once their queued work is done (without this, its destructor aborts
// them and warns that the group was not destroyed). Collectives started later throw. Does nothing
// to the local communicator; call it once every rank has started its last collective.
void shut_down(Communicator& comm);
// The collectives an NCCL run's communicator hands to its Gloo group: every tensor on the host
// and kHostGroupMaxBytes (tessera/run/communicator.hpp) or less in all. The same answer on every
// rank (a collective's tensors have the same sizes everywhere), so all ranks pick the same group.
bool travels_on_host_group(const std::vector<at::Tensor>& tensors);

// Whether this build has ProcessGroupNCCL (LibTorch built with CUDA and NCCL).
bool nccl_available();

}  // namespace tessera::core
