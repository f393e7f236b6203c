// Placements (tessera/parallel/placement.hpp) on real Gloo ranks: for every kind of placement (a
// tensor-parallel split by columns, by rows, of fused blocks, a padded vocabulary, a replicated
// tensor, stacked experts over expert-parallel ranks, a pipeline's tied copy) the whole is cut,
// gathered back onto rank 0, gathered whole onto every rank, counted once, and written by one
// rank per distinct part.
#include "tessera/parallel/placement.hpp"

#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>

#include <mutex>

#include "gloo_ranks.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera {
namespace placement_test {

ParallelDims dims(std::int64_t dp_shard, std::int64_t tp, std::int64_t ep = 1, std::int64_t pp = 1) {
  ParallelDims d;
  d.dp_shard = dp_shard;
  d.tp = tp;
  d.ep = ep;
  d.pp = pp;
  return d;
}

RunContext on_mesh(const std::shared_ptr<Communicator>& world, const ParallelDims& d) {
  RunContext run = testing::rank_context(world, 1);
  run.mesh = core::make_device_mesh(world, d);
  return run;
}

at::Tensor counting(std::vector<std::int64_t> shape) {
  std::int64_t n = 1;
  for (const auto s : shape) n *= s;
  return at::arange(n, at::kFloat).reshape(shape);
}

// One tensor of every tensor-parallel kind, whole: [out, in] by columns, by rows, a fused q|k|v
// (three blocks split each), a vocabulary of 7 rows padded to a multiple of 2 per rank, a norm.
StateDict whole_model() {
  return {{"col", counting({4, 3})},
          {"row", counting({3, 4})},
          {"qkv", counting({6, 2})},
          {"vocab", counting({7, 2})},
          {"norm", counting({3})},
          {"experts", counting({4, 2, 3})}};
}

TensorParallelPlan plan() {
  return {{"col", TensorShard::columns()},
          {"row", TensorShard::rows()},
          {"qkv", TensorShard::columns(3)},
          {"vocab", TensorShard::vocabulary(7, 2)},
          {"experts", TensorShard::expert_stack()}};
}

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

TEST(Placement, OnOneRankEveryTensorIsWholeButAPaddedVocabulary) {
  const Placements one(testing::rank_context(make_single_rank_communicator(), 1), plan());
  const StateDict whole = whole_model();
  const StateDict local = one.cut(whole);
  EXPECT_EQ(local.at("vocab").size(0), 8) << "7 rows padded to a multiple of 2";
  for (const auto& [name, t] : local) {
    const Placement p = one.of(name, t);
    EXPECT_EQ(p.whole_shape, whole.at(name).sizes().vec()) << name;
    EXPECT_EQ(p.cut(), name == "vocab") << name;
    EXPECT_TRUE(p.counted()) << name;
    EXPECT_TRUE(one.writes_state(p)) << name;
    EXPECT_EQ(p.state.end, t.numel()) << name << ": the whole local tensor's state, unsharded";
  }
  EXPECT_TRUE(one.cuts_any());
  const StateDict back = one.gather_whole(local);
  for (const auto& [name, t] : whole) EXPECT_TRUE(same(back.at(name), t)) << name;
  EXPECT_TRUE(same(one.whole("vocab", local.at("vocab")), whole.at("vocab")));
}

// Four ranks as dp_shard 2 x tp 2, with ep 2 over the data-parallel ranks: the tensor-parallel
// kinds split over tp, the experts over ep and replicated over tp.
TEST(Placement, TensorAndExpertPartsRoundTripOnFourRanks) {
  std::mutex mutex;
  std::vector<std::string> failures;
  auto expect = [&](bool ok, const std::string& what) {
    if (ok) return;
    std::lock_guard<std::mutex> lock(mutex);
    failures.push_back(what);
  };
  const StateDict whole = whole_model();
  std::int64_t whole_elements = 0;
  for (const auto& [name, t] : whole) whole_elements += t.numel();
  const auto errors = testing::run_on_gloo_ranks(4, [&](std::int64_t rank, std::shared_ptr<Communicator> world) {
    const RunContext run = on_mesh(world, dims(2, 2, 2));
    const Placements placements(run, plan());
    const std::string r = "rank " + std::to_string(rank) + ": ";
    const StateDict local = placements.cut(whole);
    const std::int64_t tp_rank = run.mesh->coordinate(MeshAxis::tp);
    // Columns: rows [2 tp, 2 tp + 2); rows: columns likewise; q|k|v: each block's half.
    expect(same(local.at("col"), whole.at("col").narrow(0, 2 * tp_rank, 2)), r + "col");
    expect(same(local.at("row"), whole.at("row").narrow(1, 2 * tp_rank, 2)), r + "row");
    expect(local.at("qkv").size(0) == 3, r + "qkv");
    expect(local.at("vocab").size(0) == 4, r + "vocab: 7 rows as 4 + 4 with one of padding");
    expect(same(local.at("norm"), whole.at("norm")), r + "norm");
    const Placement experts = placements.of("experts", local.at("experts"));
    expect(experts.part.size == 2 && experts.replica == tp_rank, r + "experts over ep, replicated over tp");
    expect(same(local.at("experts"), whole.at("experts").narrow(0, 2 * experts.part.rank, 2)), r + "expert slice");
    for (const auto& [name, t] : local) {
      const Placement p = placements.of(name, t);
      expect(p.whole_shape == whole.at(name).sizes().vec(), r + name + " whole shape");
      // Every rank of an axis gets the whole of one tensor.
      expect(same(placements.whole(name, t), whole.at(name)), r + name + " whole on every rank");
    }
    // The whole model's elements, each tensor counted whole (the padding left out), on every rank.
    std::vector<std::pair<std::string, at::Tensor>> named(local.begin(), local.end());
    const auto counts = placements.count_whole(named, {[](const std::string&, const at::Tensor&) { return true; }});
    expect(counts[0] == whole_elements, r + "whole count " + std::to_string(counts[0]));
    // A split part counts on every rank that holds it; a replicated tensor on tensor-parallel
    // rank 0 alone, as a stacked expert (whole on each tensor-parallel rank).
    expect(placements.of("col", local.at("col")).counted(), r + "col counted");
    expect(placements.of("norm", local.at("norm")).counted() == (tp_rank == 0), r + "norm counted once");
    expect(experts.counted() == (tp_rank == 0), r + "experts counted once");
    // Writers: one per distinct part. Unsharded state: the first data-parallel rank of each
    // tensor-parallel rank; a stacked expert's the first of its expert-data group, on tensor-
    // parallel rank 0 only.
    const bool first_dp = run.mesh->gradient_group().rank() == 0;
    Placement col = placements.of("col", local.at("col"));
    expect(placements.writes_state(col) == first_dp, r + "col writer");
    expect(placements.writes_state(experts) == (tp_rank == 0 && run.mesh->expert_data_parallel().rank() == 0),
           r + "expert writer");
    // A strategy that shards the state (zero, fsdp) gives every rank a share to write, but a
    // hybrid replica's.
    col.state = {0, 3, /*sharded=*/true, /*replica=*/false};
    expect(placements.writes_state(col), r + "sharded: every share");
    col.state.replica = true;
    expect(!placements.writes_state(col), r + "a hybrid replica");
    // Back to whole on rank 0 alone.
    const StateDict back = placements.gather_whole(local);
    if (rank == 0) {
      for (const auto& [name, t] : whole) expect(back.count(name) && same(back.at(name), t), r + name + " gathered");
    } else {
      expect(back.empty(), r + "gathers onto rank 0 only");
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_TRUE(failures.empty()) << [&] {
    std::string all;
    for (const auto& f : failures) all += f + "\n";
    return all;
  }();
}

// Two pipeline stages, each holding its own tensors and both a tied embedding: the last stage's
// copy is a tied copy (not counted, not written), and the stages' tensors come together on rank 0
// with the first stage's copy.
TEST(Placement, APipelinesTiedCopyIsCountedAndWrittenOnceOnTwoStages) {
  std::mutex mutex;
  std::vector<std::string> seen(2);
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> world) {
    const RunContext run = on_mesh(world, dims(1, 1, 1, 2));
    const Placements placements(run, {}, {"embed"});
    StateDict local = {{"embed", at::full({3, 2}, rank == 0 ? 1.0 : 9.0)},
                       {"block" + std::to_string(rank), at::full({2}, static_cast<double>(rank))}};
    const Placement embed = placements.of("embed", local.at("embed"));
    std::vector<std::pair<std::string, at::Tensor>> named(local.begin(), local.end());
    const auto counts = placements.count_whole(named, {[](const std::string&, const at::Tensor&) { return true; }});
    const StateDict back = placements.gather_whole(local);
    std::string s = std::to_string(embed.tied_copy) + std::to_string(embed.counted()) +
                    std::to_string(placements.writes_state(embed)) + " " + std::to_string(counts[0]);
    if (rank == 0) {
      s += " " + std::to_string(back.size()) + " " + std::to_string(back.at("embed")[0][0].item<double>()) + " " +
           std::to_string(back.at("block1")[0].item<double>());
    }
    std::lock_guard<std::mutex> lock(mutex);
    seen[static_cast<std::size_t>(rank)] = s;
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // 6 + 2 + 2 elements: the tied embedding once.
  EXPECT_EQ(seen[0], "011 10 3 1.000000 1.000000");
  EXPECT_EQ(seen[1], "100 10");
}

}  // namespace placement_test
}  // namespace tessera
