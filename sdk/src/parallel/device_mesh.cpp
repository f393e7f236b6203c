// The device mesh: coordinates in a mixed radix, group names and members, and the communicator
// of one rank that stands in for every group of one.
#include "tessera/parallel/device_mesh.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "tessera/error.hpp"

namespace tessera {
namespace {

// Outer to inner: the order of the mixed radix and of group names.
constexpr std::array<MeshAxis, 5> kAxes = {MeshAxis::pp, MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp,
                                           MeshAxis::tp};

class DoneCollective final : public PendingCollective {
 public:
  void wait() override {}
};

class SingleRankCommunicator final : public Communicator {
 public:
  std::int64_t rank() const override { return 0; }
  std::int64_t world_size() const override { return 1; }
  std::shared_ptr<PendingCollective> all_reduce_async(at::Tensor&, ReduceOp) override { return done(); }
  std::shared_ptr<PendingCollective> all_gather_async(std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    outputs.at(0).copy_(input);
    return done();
  }
  std::shared_ptr<PendingCollective> reduce_scatter_async(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                                          ReduceOp) override {
    output.copy_(inputs.at(0));
    return done();
  }
  std::shared_ptr<PendingCollective> all_to_all_async(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs) override {
    outputs.at(0).copy_(inputs.at(0));
    return done();
  }
  std::shared_ptr<PendingCollective> send_async(at::Tensor&, std::int64_t peer, int) override { return no_peer(peer); }
  std::shared_ptr<PendingCollective> recv_async(at::Tensor&, std::int64_t peer, int) override { return no_peer(peer); }
  void broadcast(at::Tensor&, std::int64_t) override {}
  void barrier() override {}

 private:
  static std::shared_ptr<PendingCollective> done() { return std::make_shared<DoneCollective>(); }
  static std::shared_ptr<PendingCollective> no_peer(std::int64_t peer) {
    throw Error("point-to-point with rank " + std::to_string(peer) + " in a group of one rank: there is no peer");
  }
};

}  // namespace

std::shared_ptr<Communicator> make_single_rank_communicator() { return std::make_shared<SingleRankCommunicator>(); }

const char* axis_name(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::pp: return "pp";
    case MeshAxis::dp_replicate: return "dp_replicate";
    case MeshAxis::dp_shard: return "dp_shard";
    case MeshAxis::cp: return "cp";
    case MeshAxis::tp: return "tp";
  }
  return "?";
}

std::int64_t ParallelDims::size(MeshAxis axis) const {
  switch (axis) {
    case MeshAxis::pp: return pp;
    case MeshAxis::dp_replicate: return dp_replicate;
    case MeshAxis::dp_shard: return dp_shard;
    case MeshAxis::cp: return cp;
    case MeshAxis::tp: return tp;
  }
  return 1;
}

std::int64_t ParallelDims::world_size() const { return pp * dp_replicate * dp_shard * cp * tp; }

std::string ParallelDims::describe() const {
  std::string out;
  for (MeshAxis axis : kAxes) {
    if (size(axis) == 1) continue;
    if (!out.empty()) out += " x ";
    out += std::string(axis_name(axis)) + " " + std::to_string(size(axis));
  }
  if (ep > 1) out += (out.empty() ? "" : ", ") + std::string("ep ") + std::to_string(ep);
  if (sequence_parallel && tp > 1) out += " with sequence parallelism";
  return out.empty() ? "1 rank" : out;
}

std::int64_t mesh_coordinate(const ParallelDims& dims, std::int64_t rank, MeshAxis axis) {
  std::int64_t stride = 1;
  for (auto it = kAxes.rbegin(); it != kAxes.rend(); ++it) {
    if (*it == axis) return (rank / stride) % dims.size(axis);
    stride *= dims.size(*it);
  }
  return 0;
}

DeviceMesh::DeviceMesh(ParallelDims dims, std::int64_t rank, std::shared_ptr<Communicator> world,
                       std::map<std::string, std::shared_ptr<Communicator>> groups)
    : dims_(dims), rank_(rank), world_(std::move(world)), groups_(std::move(groups)),
      alone_(make_single_rank_communicator()) {
  if (!world_) throw Error("device mesh: no world communicator");
  if (dims_.world_size() != world_->world_size()) {
    throw Error("device mesh " + dims_.describe() + " has " + std::to_string(dims_.world_size()) +
                " ranks, the run " + std::to_string(world_->world_size()));
  }
}

std::shared_ptr<DeviceMesh> DeviceMesh::data_parallel_only(std::shared_ptr<Communicator> world) {
  ParallelDims dims;
  dims.dp_shard = world->world_size();
  const std::int64_t rank = world->rank();
  std::map<std::string, std::shared_ptr<Communicator>> groups;
  groups["dp_shard"] = world;
  return std::make_shared<DeviceMesh>(dims, rank, std::move(world), std::move(groups));
}

std::int64_t DeviceMesh::coordinate(MeshAxis axis) const { return mesh_coordinate(dims_, rank_, axis); }

std::string DeviceMesh::group_name(const ParallelDims& dims, const std::vector<MeshAxis>& axes) {
  std::string name;
  for (MeshAxis axis : kAxes) {
    if (dims.size(axis) == 1 || std::find(axes.begin(), axes.end(), axis) == axes.end()) continue;
    if (!name.empty()) name += "_";
    name += axis_name(axis);
  }
  return name;
}

std::vector<std::int64_t> DeviceMesh::group_members(const ParallelDims& dims, const std::vector<MeshAxis>& axes,
                                                    std::int64_t member) {
  std::vector<std::int64_t> members;
  for (std::int64_t r = 0; r < dims.world_size(); ++r) {
    bool same = true;
    for (MeshAxis axis : kAxes) {
      const bool in_group = std::find(axes.begin(), axes.end(), axis) != axes.end();
      same = same && (in_group || mesh_coordinate(dims, r, axis) == mesh_coordinate(dims, member, axis));
    }
    if (same) members.push_back(r);
  }
  return members;
}

std::shared_ptr<Communicator> DeviceMesh::group_ptr(const std::vector<MeshAxis>& axes) const {
  const std::string name = group_name(dims_, axes);
  if (name.empty()) return alone_;
  if (static_cast<std::int64_t>(group_members(dims_, axes, rank_).size()) == dims_.world_size()) return world_;
  const auto it = groups_.find(name);
  if (it == groups_.end()) throw Error("device mesh " + dims_.describe() + ": the host made no group " + name);
  return it->second;
}

Communicator& DeviceMesh::group(const std::vector<MeshAxis>& axes) const { return *group_ptr(axes); }

std::vector<std::int64_t> DeviceMesh::pipeline_ends_members(const ParallelDims& dims, std::int64_t member) {
  const std::int64_t stage = mesh_coordinate(dims, member, MeshAxis::pp);
  if (dims.pp == 1 || (stage != 0 && stage != dims.pp - 1)) return {member};
  std::vector<std::int64_t> members;
  for (const std::int64_t r : group_members(dims, {MeshAxis::pp}, member)) {
    const std::int64_t s = mesh_coordinate(dims, r, MeshAxis::pp);
    if (s == 0 || s == dims.pp - 1) members.push_back(r);
  }
  return members;
}

std::shared_ptr<Communicator> DeviceMesh::pipeline_ends_ptr() const {
  const auto members = pipeline_ends_members(dims_, rank_);
  if (members.size() <= 1) return alone_;
  if (dims_.pp == 2) return group_ptr({MeshAxis::pp});
  const auto it = groups_.find("pp_ends");
  if (it == groups_.end()) throw Error("device mesh " + dims_.describe() + ": the host made no group pp_ends");
  return it->second;
}

std::shared_ptr<Communicator> DeviceMesh::pipeline_gradients_ptr() const {
  if (dims_.pp == 1) return alone_;
  const auto it = groups_.find("pp_gradients");
  if (it == groups_.end()) throw Error("device mesh " + dims_.describe() + ": the host made no group pp_gradients");
  return it->second;
}

std::vector<std::int64_t> DeviceMesh::expert_group_members(const ParallelDims& dims, std::int64_t member, bool data) {
  std::vector<std::int64_t> members;
  const std::int64_t ep = dims.ep, d = mesh_coordinate(dims, member, MeshAxis::dp_shard);
  for (std::int64_t r = 0; r < dims.world_size(); ++r) {
    const std::int64_t rd = mesh_coordinate(dims, r, MeshAxis::dp_shard);
    bool same = mesh_coordinate(dims, r, MeshAxis::pp) == mesh_coordinate(dims, member, MeshAxis::pp) &&
                mesh_coordinate(dims, r, MeshAxis::tp) == mesh_coordinate(dims, member, MeshAxis::tp);
    if (data) {
      same = same && rd % ep == d % ep;
    } else {
      same = same && rd / ep == d / ep &&
             mesh_coordinate(dims, r, MeshAxis::dp_replicate) == mesh_coordinate(dims, member, MeshAxis::dp_replicate) &&
             mesh_coordinate(dims, r, MeshAxis::cp) == mesh_coordinate(dims, member, MeshAxis::cp);
    }
    if (same) members.push_back(r);
  }
  return members;
}

namespace {
std::shared_ptr<Communicator> named_group(const std::map<std::string, std::shared_ptr<Communicator>>& groups,
                                          const std::string& name, std::int64_t size,
                                          const std::shared_ptr<Communicator>& world,
                                          const std::shared_ptr<Communicator>& alone) {
  if (size == 1) return alone;
  const auto it = groups.find(name);
  if (it != groups.end()) return it->second;
  if (size == world->world_size()) return world;
  throw Error("device mesh: the host made no group " + name);
}
}  // namespace

// Without expert parallelism every rank holds every expert: the expert-parallel group is the rank
// alone and the expert data-parallel group is the gradient group.
std::shared_ptr<Communicator> DeviceMesh::expert_parallel_ptr() const {
  if (dims_.ep == 1) return alone_;
  return named_group(groups_, "ep", static_cast<std::int64_t>(expert_group_members(dims_, rank_, false).size()), world_,
                     alone_);
}
std::shared_ptr<Communicator> DeviceMesh::expert_data_parallel_ptr() const {
  if (dims_.ep == 1) return group_ptr({MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp});
  return named_group(groups_, "expert_dp", static_cast<std::int64_t>(expert_group_members(dims_, rank_, true).size()),
                     world_, alone_);
}
Communicator& DeviceMesh::expert_parallel() const { return *expert_parallel_ptr(); }
Communicator& DeviceMesh::expert_data_parallel() const { return *expert_data_parallel_ptr(); }

std::int64_t DeviceMesh::bytes_communicated() const {
  std::int64_t bytes = world_->bytes_communicated();
  for (const auto& [name, group] : groups_) {
    if (group != world_) bytes += group->bytes_communicated();
  }
  return bytes;
}

std::map<std::string, std::int64_t> DeviceMesh::bytes_communicated_by_group() const {
  std::map<std::string, std::int64_t> bytes{{"world", world_->bytes_communicated()}};
  for (const auto& [name, group] : groups_) {
    if (group != world_) bytes[name] = group->bytes_communicated();
  }
  return bytes;
}

double DeviceMesh::wait_seconds() const {
  double seconds = world_->wait_seconds();
  for (const auto& [name, group] : groups_) {
    if (group != world_) seconds += group->wait_seconds();
  }
  return seconds;
}

std::vector<std::vector<MeshAxis>> DeviceMesh::standard_groups() {
  return {{MeshAxis::tp},
          {MeshAxis::dp_replicate},
          {MeshAxis::dp_shard},
          {MeshAxis::cp},
          {MeshAxis::pp},
          {MeshAxis::dp_replicate, MeshAxis::dp_shard},
          {MeshAxis::dp_shard, MeshAxis::cp},
          {MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp},
          {MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::tp},
          {MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::tp, MeshAxis::pp}};
}

std::shared_ptr<Communicator> data_parallel_group(const RunContext& run) {
  if (run.mesh) return run.mesh->group_ptr({MeshAxis::dp_replicate, MeshAxis::dp_shard});
  return run.communicator ? run.communicator : make_single_rank_communicator();
}

}  // namespace tessera
