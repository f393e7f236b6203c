// The device mesh: coordinates in the mixed radix pp > dp_replicate > dp_shard > cp > tp, group
// names and members, `parallelism:` resolved against the world size, and the groups the host
// makes over real Gloo ranks (each a working communicator of its members).
#include "tessera/parallel/device_mesh.hpp"

#include <gtest/gtest.h>

#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include <mutex>
#include <set>

#include "gloo_ranks.hpp"
#include "tessera/core/run/parallelism_settings.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace device_mesh_test {

ParallelDims dims(std::int64_t dp_replicate, std::int64_t dp_shard, std::int64_t tp) {
  ParallelDims d;
  d.dp_replicate = dp_replicate;
  d.dp_shard = dp_shard;
  d.tp = tp;
  return d;
}

TEST(DeviceMesh, TensorParallelPeersAreNeighbouringRanks) {
  const ParallelDims d = dims(2, 2, 2);  // 8 ranks
  EXPECT_EQ(d.world_size(), 8);
  EXPECT_EQ(d.describe(), "dp_replicate 2 x dp_shard 2 x tp 2");
  // Rank 5 = 1·4 + 0·2 + 1: replica 1, shard 0, tp 1.
  EXPECT_EQ(mesh_coordinate(d, 5, MeshAxis::dp_replicate), 1);
  EXPECT_EQ(mesh_coordinate(d, 5, MeshAxis::dp_shard), 0);
  EXPECT_EQ(mesh_coordinate(d, 5, MeshAxis::tp), 1);
  auto members = [&](const std::vector<MeshAxis>& axes) { return DeviceMesh::group_members(d, axes, 5); };
  EXPECT_EQ(members({MeshAxis::tp}), (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(members({MeshAxis::dp_shard}), (std::vector<std::int64_t>{5, 7}));
  EXPECT_EQ(members({MeshAxis::dp_replicate}), (std::vector<std::int64_t>{1, 5}));
  EXPECT_EQ(members({MeshAxis::dp_replicate, MeshAxis::dp_shard}), (std::vector<std::int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(DeviceMesh::group_name(d, {MeshAxis::dp_shard, MeshAxis::dp_replicate}), "dp_replicate_dp_shard");
  // Axes of size one drop out of names: with tp 1 the data-parallel group is "dp_shard".
  EXPECT_EQ(DeviceMesh::group_name(dims(1, 4, 1), {MeshAxis::dp_replicate, MeshAxis::dp_shard}), "dp_shard");
  EXPECT_EQ(DeviceMesh::group_name(dims(1, 4, 1), {MeshAxis::tp}), "");
}

TEST(DeviceMesh, TheOneRankMeshHasEveryGroupAsTheRankAlone) {
  const auto mesh = DeviceMesh::data_parallel_only(make_single_rank_communicator());
  EXPECT_EQ(mesh->dims().world_size(), 1);
  EXPECT_EQ(mesh->tensor_parallel().world_size(), 1);
  EXPECT_EQ(mesh->data_parallel().world_size(), 1);
  EXPECT_EQ(mesh->loss_group().world_size(), 1);
  EXPECT_EQ(mesh->dims().describe(), "1 rank");
}

TEST(ParallelismSettings, ResolvesTheRanksLeftAndRefusesAProductThatIsNotTheWorld) {
  core::ParallelismSettings s;
  s.tp = 2;
  EXPECT_EQ(core::resolve_parallel_dims(s, 8, true).dp_shard, 4) << "dp_shard -1 takes the ranks tp leaves";
  EXPECT_EQ(core::resolve_parallel_dims(s, 1, false).dp_shard, 1) << "a spec validated alone";
  try {
    core::resolve_parallel_dims(s, 3, true);
    ADD_FAILURE() << "tp 2 over 3 ranks was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "dp_shard");
    EXPECT_NE(std::string(e.what()).find("does not divide the 3 ranks"), std::string::npos) << e.what();
  }
  s.dp_shard = 2;
  try {
    core::resolve_parallel_dims(s, 8, true);
    ADD_FAILURE() << "a mesh of 4 ranks was accepted for 8";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp_shard 2 x tp 2 has 4 ranks but this run has 8"), std::string::npos)
        << e.what();
  }
}

// Expert parallelism borrows dp_shard's ranks: with dp_shard 4 and ep 2, expert-parallel peers are
// consecutive data-parallel ranks (d / ep the same), and the ranks holding the same experts are
// every ep-th one (d % ep the same); under tp each tp rank has its own such groups.
TEST(DeviceMesh, ExpertGroupsSplitTheDataParallelRanks) {
  ParallelDims d = dims(1, 4, 2);  // 8 ranks: rank = shard * 2 + tp
  d.ep = 2;
  auto members = [&](std::int64_t rank, bool data) { return DeviceMesh::expert_group_members(d, rank, data); };
  EXPECT_EQ(members(0, false), (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(members(4, false), (std::vector<std::int64_t>{4, 6}));
  EXPECT_EQ(members(0, true), (std::vector<std::int64_t>{0, 4}));
  EXPECT_EQ(members(3, true), (std::vector<std::int64_t>{3, 7}));
  EXPECT_EQ(members(5, false), (std::vector<std::int64_t>{5, 7}));
  d.ep = 4;
  EXPECT_EQ(members(6, false), (std::vector<std::int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(members(6, true), (std::vector<std::int64_t>{6}));
}

// Four Gloo ranks as a (dp_shard 2, tp 2) mesh: every group the host makes reduces over exactly
// its members.
TEST(DeviceMesh, TheHostsGroupsReduceOverTheirMembersOnly) {
  std::mutex mutex;
  std::vector<std::string> seen(4);
  const auto errors = testing::run_on_gloo_ranks(4, [&](std::int64_t rank, std::shared_ptr<Communicator> world) {
    const auto mesh = core::make_device_mesh(world, dims(1, 2, 2));
    auto sum_of_ranks = [&](Communicator& group) {
      at::Tensor t = at::tensor({rank}, at::kLong);
      group.all_reduce(t);
      return t.item<std::int64_t>();
    };
    const std::int64_t tp = sum_of_ranks(mesh->tensor_parallel());
    const std::int64_t dp = sum_of_ranks(mesh->data_parallel());
    const std::int64_t all = sum_of_ranks(mesh->loss_group());
    std::lock_guard<std::mutex> lock(mutex);
    seen[static_cast<std::size_t>(rank)] = std::to_string(tp) + " " + std::to_string(dp) + " " + std::to_string(all);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // tp groups {0,1}, {2,3}; dp groups {0,2}, {1,3}; the loss group is every rank.
  EXPECT_EQ(seen, (std::vector<std::string>{"1 2 6", "1 4 6", "5 2 6", "5 4 6"}));
}

// all_to_all with a different size for every pair, and send/receive, over real Gloo ranks.
TEST(Communicator, AllToAllOfUnevenPartsAndPointToPoint) {
  const auto errors = testing::run_on_gloo_ranks(3, [&](std::int64_t rank, std::shared_ptr<Communicator> world) {
    // Rank r sends (r + 1) * (d + 1) elements of value 10 r + d to rank d.
    std::vector<at::Tensor> inputs, outputs;
    for (std::int64_t d = 0; d < 3; ++d) {
      inputs.push_back(at::full({(rank + 1) * (d + 1)}, static_cast<double>(10 * rank + d), at::kFloat));
      outputs.push_back(at::empty({(d + 1) * (rank + 1)}, at::kFloat));
    }
    world->all_to_all(outputs, inputs);
    for (std::int64_t s = 0; s < 3; ++s) {
      if (!outputs[s].eq(static_cast<double>(10 * s + rank)).all().item<bool>()) {
        throw Error("rank " + std::to_string(rank) + " got the wrong part from " + std::to_string(s));
      }
    }
    // A ring: each rank sends its rank to the next and receives the previous one's.
    at::Tensor mine = at::tensor({rank * 1.0}, at::kFloat), theirs = at::zeros({1}, at::kFloat);
    auto sent = world->send_async(mine, (rank + 1) % 3);
    world->recv_async(theirs, (rank + 2) % 3)->wait();
    sent->wait();
    if (theirs.item<float>() != static_cast<float>((rank + 2) % 3)) throw Error("received the wrong rank");
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

}  // namespace device_mesh_test
}  // namespace tessera
