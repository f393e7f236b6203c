// Checkpoint pieces without a training run: joining optimizer state saved in parts by several
// ranks and cutting it for another layout, and finding the newest valid checkpoint.
#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/checkpoint/checkpoint_store.hpp"
#include "tessera/core/checkpoint/checkpoint_writer.hpp"
#include "tessera/core/checkpoint/reshard.hpp"

#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>

#include <filesystem>
#include <fstream>

#include "tessera/parallel/saved_shares.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace checkpoint_test {

using testing::TempDir;

at::Tensor range(std::int64_t begin, std::int64_t end, std::int64_t numel) {
  return at::tensor({begin, end, numel}, at::kLong);
}

TEST(OptimizerReshard, PartsFromTwoRanksJoinAndCutForThree) {
  // Parameter 0 is 2x3 (6 elements), parameter 1 has 3; flat layout split as two ranks would.
  const at::Tensor avg0 = at::arange(6).to(at::kFloat).view({2, 3}), avg1 = at::arange(10, 13).to(at::kFloat);
  StateDict rank0 = {{"param.0.exp_avg", avg0.reshape({-1}).narrow(0, 0, 4)},
                     {"param.0.step", at::scalar_tensor(7, at::kLong)},
                     {"param.1.exp_avg", at::empty({0})},
                     {"param.1.step", at::scalar_tensor(7, at::kLong)}};
  StateDict ranges0 = {{"param.0", range(0, 4, 6)}, {"param.1", range(0, 0, 3)}};
  StateDict rank1 = {{"param.0.exp_avg", avg0.reshape({-1}).narrow(0, 4, 2)},
                     {"param.0.step", at::scalar_tensor(7, at::kLong)},
                     {"param.1.exp_avg", avg1},
                     {"param.1.step", at::scalar_tensor(7, at::kLong)}};
  StateDict ranges1 = {{"param.0", range(4, 6, 6)}, {"param.1", range(0, 3, 3)}};
  const StateDict whole = merge_optimizer_parts({{rank0, ranges0}, {rank1, ranges1}});
  EXPECT_TRUE(whole.at("param.0.exp_avg").equal(avg0.reshape({-1})));
  EXPECT_TRUE(whole.at("param.1.exp_avg").equal(avg1));
  EXPECT_EQ(whole.at("param.0.step").item<std::int64_t>(), 7);

  const std::vector<at::Tensor> params = {at::empty({2, 3}), at::empty({3})};
  // One rank, unsharded: shaped like the parameters.
  const StateDict one = optimizer_state_for(whole, params, nullptr);
  EXPECT_TRUE(one.at("param.0.exp_avg").equal(avg0));
  // Rank 1 of three: its own ranges.
  const std::vector<std::pair<std::int64_t, std::int64_t>> mine = {{3, 5}, {0, 1}};
  const StateDict cut = optimizer_state_for(whole, params, &mine);
  EXPECT_TRUE(cut.at("param.0.exp_avg").equal(at::tensor({3.0f, 4.0f})));
  EXPECT_TRUE(cut.at("param.1.exp_avg").equal(at::tensor({10.0f})));
  EXPECT_EQ(cut.at("param.1.step").item<std::int64_t>(), 7);
}

TEST(OptimizerReshard, StateForAnotherModelIsRefused) {
  const StateDict whole = {{"param.0.exp_avg", at::arange(6).to(at::kFloat)}};
  EXPECT_THROW(optimizer_state_for(whole, {at::empty({5})}, nullptr), CheckpointError);
  EXPECT_THROW(optimizer_state_for(whole, {}, nullptr), CheckpointError);
  EXPECT_THROW(merge_optimizer_parts({{whole, {}}}), CheckpointError) << "a part without its range";
}

// Files of four ranks, tp 2 x dp 2 under zero: parameter 0 is [4, 3] split by columns (rows of
// the weight), each tensor-parallel part shared over its two data-parallel ranks, and an
// unsplit step count. merge_optimizer_files joins them whole through the layouts; a lost file is
// refused with what is missing.
TEST(OptimizerReshard, FilesOfATensorParallelMeshJoinThroughTheirLayouts) {
  const at::Tensor whole = at::arange(12).to(at::kFloat).view({4, 3});
  std::vector<OptimizerPart> files;
  for (std::int64_t tp = 0; tp < 2; ++tp) {
    Placement p;
    p.shard = TensorShard::columns();
    p.part = {tp, 2};
    p.whole_shape = {4, 3};
    const at::Tensor local = whole.narrow(0, 2 * tp, 2).reshape({-1});  // 6 elements
    for (const auto& [begin, end] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 4}, {4, 6}}) {
      OptimizerPart f;
      f.state = {{"param.0.exp_avg", local.narrow(0, begin, end - begin).clone()},
                 {"param.0.step", at::scalar_tensor(3, at::kLong)}};
      f.ranges = {{"param.0", range(begin, end, 6)}};
      f.layouts = {{"param.0", layout_of(p, {2, 3})}};
      files.push_back(f);
    }
  }
  const StateDict merged = merge_optimizer_files(files);
  EXPECT_TRUE(merged.at("param.0.exp_avg").equal(whole.reshape({-1})));
  EXPECT_EQ(merged.at("param.0.step").item<std::int64_t>(), 3);
  files.pop_back();  // tp rank 1's second share lost
  try {
    merge_optimizer_files(files);
    FAIL() << "a lost share was filled";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer state param.0.exp_avg has saved parts that cover 4 of 6"),
              std::string::npos)
        << e.what();
  }
}

TEST(CheckpointDiscovery, IgnoresIncompleteAndCorruptAndPicksTheNewestValid) {
  TempDir dir;
  namespace fs = std::filesystem;
  const CheckpointStore store(dir.path().string(), dir.file("exports"));
  auto save = [&](std::int64_t step) {
    CheckpointState state;
    state.step = step;
    state.model = {{"w", at::arange(4).to(at::kFloat)}};
    state.write_optimizer = true;
    state.optimizer = {{"param.0.exp_avg", at::arange(4).to(at::kFloat)}};
    state.optimizer_ranges = {{"param.0", range(0, 4, 4)}};
    state.data = {{"position", at::scalar_tensor(step, at::kLong)}};
    ASSERT_TRUE(write_checkpoint(store, state, /*keep_last=*/0, std::chrono::seconds(5)));
  };
  save(2);
  save(4);
  EXPECT_FALSE(write_checkpoint(store, CheckpointState{4}, 0, std::chrono::seconds(5)))
      << "a step that exists is not written again";
  fs::create_directories(dir.file("step_00000006.tmp/rank_00000"));  // an interrupted save
  EXPECT_EQ(store.newest_valid(), dir.file("step_00000004"));
  const auto loaded = read_checkpoint(dir.file("step_00000004"), 0);
  EXPECT_EQ(loaded.metadata.step, 4);
  EXPECT_EQ(loaded.data.at("position").item<std::int64_t>(), 4);
  EXPECT_TRUE(loaded.optimizer.at("param.0.exp_avg").equal(at::arange(4).to(at::kFloat)));

  std::ofstream(dir.file("step_00000004/model.safetensors"), std::ios::app) << "x";  // grown by a byte
  EXPECT_THROW(verify_checkpoint(dir.file("step_00000004")), CheckpointError);
  EXPECT_EQ(store.newest_valid(), dir.file("step_00000002"));
  store.remove_incomplete();
  EXPECT_FALSE(fs::exists(dir.file("step_00000006.tmp")));
  EXPECT_TRUE(fs::exists(dir.file("step_00000002")));
}

// A file list (metadata.json, a rank's manifest.json) may only name files inside the checkpoint,
// and a malformed one is a CheckpointError naming the file, never a JSON library exception.
TEST(CheckpointFiles, ListsOnlyFilesInsideTheCheckpointAndRefuseMalformedOnes) {
  TempDir dir;
  const std::string good = dir.write("good.json", R"({"rank_00001/rng.safetensors": {"bytes": 10, "crc32c": 7}})");
  const auto files = read_rank_manifest(good);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files.at("rank_00001/rng.safetensors").bytes, 10u);
  EXPECT_EQ(files.at("rank_00001/rng.safetensors").crc32c, 7u);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"../../etc/passwd": {"bytes": 1, "crc32c": 1}})", "not a file inside the checkpoint"},
      {R"({"/etc/passwd": {"bytes": 1, "crc32c": 1}})", "not a file inside the checkpoint"},
      {R"({"rank_00001/a": {"bytes": "ten", "crc32c": 1}})", R"(bytes is "ten", not an integer in range)"},
      {R"(["not", "an", "object"])", "the file list is not an object"},
      {R"({"x": )", "is malformed"},
      // A float where an integer belongs converted with undefined behaviour (found by fuzzing).
      {R"({"rank_00001/a": {"bytes": 6.2e34, "crc32c": 1}})", "bytes is 6.2e+34, not an integer in range"},
      {R"({"rank_00001/a": {"bytes": 1, "crc32c": 4294967296}})", "crc32c is 4294967296, not an integer in range"},
  };
  for (const auto& [text, says] : bad) {
    const std::string path = dir.write("bad.json", text);
    try {
      read_rank_manifest(path);
      ADD_FAILURE() << text;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

}  // namespace checkpoint_test
}  // namespace tessera::core
