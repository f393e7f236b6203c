// The device mesh's process groups: one per standard group of the mesh, each over its members'
// c10d backend, made by every rank in the same order.
#include <map>
#include <string>

#include "tessera/core/distributed/distributed.hpp"
#include "tessera/log.hpp"

namespace tessera::core {

std::shared_ptr<DeviceMesh> make_device_mesh(const std::shared_ptr<Communicator>& world, const ParallelDims& dims) {
  const auto mesh = make_device_mesh(world, dims, [&](const std::string& name, const std::vector<std::int64_t>& members) {
    return make_subgroup(*world, name, members);
  });
  // A mesh with groups of its own (not data parallelism alone).
  if (world->rank() == 0 && mesh->bytes_communicated_by_group().size() > 1) log::info("device mesh: ", dims.describe());
  return mesh;
}

std::shared_ptr<DeviceMesh> make_device_mesh(const std::shared_ptr<Communicator>& world, const ParallelDims& dims,
                                             const MakeGroup& make_group) {
  const std::int64_t rank = world->rank();
  std::map<std::string, std::shared_ptr<Communicator>> groups;
  for (const auto& axes : DeviceMesh::standard_groups()) {
    const std::string name = DeviceMesh::group_name(dims, axes);
    const auto members = DeviceMesh::group_members(dims, axes, rank);
    if (name.empty() || groups.count(name) || members.size() <= 1 ||
        static_cast<std::int64_t>(members.size()) == world->world_size()) {
      continue;
    }
    // Each group of the same axes has its own keys: its first member tells it apart.
    groups[name] = make_group("mesh/" + name + "/" + std::to_string(members.front()), members);
  }
  // Expert parallelism's groups, borrowed from dp_shard. The expert-parallel one is a group of its
  // own even when it spans every rank: its all-to-alls are counted apart (communicated_bytes/ep).
  if (dims.ep > 1) {
    for (const auto& [name, data] : {std::pair<const char*, bool>{"ep", false}, {"expert_dp", true}}) {
      const auto members = DeviceMesh::expert_group_members(dims, rank, data);
      const bool spans_world = static_cast<std::int64_t>(members.size()) == world->world_size();
      if (members.size() <= 1 || (spans_world && std::string(name) != "ep")) continue;
      groups[name] = make_group(std::string("mesh/") + name + "/" + std::to_string(members.front()), members);
    }
  }
  // The pipeline's second group, for gradients (DeviceMesh::pipeline_gradients_ptr): its own
  // communicator even when it spans every rank.
  if (dims.pp > 1) {
    const auto members = DeviceMesh::group_members(dims, {MeshAxis::pp}, rank);
    groups["pp_gradients"] = make_group("mesh/pp_gradients/" + std::to_string(members.front()), members);
  }
  // The pipeline's two ends, which hold a tied embedding (with pp 2 they are the pp group); the
  // middle stages' ranks take no part.
  if (dims.pp > 2) {
    const auto members = DeviceMesh::pipeline_ends_members(dims, rank);
    if (members.size() > 1) {
      groups["pp_ends"] = make_group("mesh/pp_ends/" + std::to_string(members.front()), members);
    }
  }
  return std::make_shared<DeviceMesh>(dims, rank, world, std::move(groups));
}

}  // namespace tessera::core
