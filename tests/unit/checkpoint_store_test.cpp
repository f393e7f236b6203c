// The checkpoint store, the one owner of the checkpoint folders' layout: names and paths,
// listing, `latest`, keep-last-N, superseded checkpoints, leftovers of interrupted saves.
#include "tessera/core/checkpoint/checkpoint_store.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tessera/core/checkpoint/checkpoint_writer.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace checkpoint_store_test {

namespace fs = std::filesystem;
using testing::TempDir;

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

void save(const CheckpointStore& store, std::int64_t step, std::int64_t keep_last = 0) {
  CheckpointState state;
  state.step = step;
  state.model = {{"w", at::arange(4).to(at::kFloat)}};
  state.write_optimizer = true;
  state.optimizer_ranges = {{"param.0", at::tensor({0, 4, 4}, at::kLong)}};
  ASSERT_TRUE(write_checkpoint(store, state, keep_last, std::chrono::seconds(5)));
}

TEST(CheckpointStore, NamesAndPathsFollowTheDocumentedLayout) {
  const CheckpointStore store("/runs/a/checkpoints", "/runs/a/exports");
  EXPECT_EQ(CheckpointStore::name_of(1000), "step_00001000");
  EXPECT_EQ(store.checkpoint(1000).path(), fs::path("/runs/a/checkpoints/step_00001000"));
  EXPECT_EQ(store.in_progress(1000).path(), fs::path("/runs/a/checkpoints/step_00001000.tmp"));
  EXPECT_EQ(store.export_folder(7), fs::path("/runs/a/exports/step_00000007"));
  EXPECT_EQ(store.export_in_progress(7), fs::path("/runs/a/exports/step_00000007.tmp"));
  EXPECT_EQ(store.checkpoint(3).file(CheckpointFolder::rank_file(2, CheckpointFolder::kOptimizer)),
            fs::path("/runs/a/checkpoints/step_00000003/rank_00002/optimizer.safetensors"));
  EXPECT_EQ(CheckpointStore::step_of("/x/step_00000042"), 42);
  EXPECT_EQ(CheckpointStore::step_of("step_00000042.tmp"), -1);
  EXPECT_EQ(CheckpointStore::step_of("step_"), -1);
  EXPECT_EQ(CheckpointStore::step_of("latest"), -1);
}

TEST(CheckpointStore, ListsCompleteFoldersNewestFirstAndPointsLatestAtTheNewest) {
  TempDir dir;
  const CheckpointStore store(dir.file("checkpoints"), dir.file("exports"));
  save(store, 2);
  save(store, 10);
  save(store, 4);
  fs::create_directories(dir.file("checkpoints/step_00000012.tmp"));
  fs::create_directories(dir.file("checkpoints/step_00000020.superseded"));
  const auto complete = store.complete();
  ASSERT_EQ(complete.size(), 3u);
  EXPECT_EQ(complete[0].first, 10);
  EXPECT_EQ(complete[1].first, 4);
  EXPECT_EQ(complete[2].first, 2);
  EXPECT_EQ(text_of(dir.file("checkpoints/latest")), "step_00000004") << "latest names the last written";
  EXPECT_EQ(store.newest_valid(), dir.file("checkpoints/step_00000010")) << "by step, not by `latest`";
  store.remove_incomplete();
  EXPECT_FALSE(fs::exists(dir.file("checkpoints/step_00000012.tmp")));
  EXPECT_TRUE(fs::exists(dir.file("checkpoints/step_00000020.superseded")));
}

TEST(CheckpointStore, KeepLastPrunesTheOldestUpToTheNewOneOnly) {
  TempDir dir;
  const CheckpointStore store(dir.file("checkpoints"), dir.file("exports"));
  save(store, 9);  // a later checkpoint is not this save's to judge
  save(store, 1);
  save(store, 2);
  save(store, 3, /*keep_last=*/2);
  EXPECT_FALSE(fs::exists(store.checkpoint(1).path()));
  EXPECT_TRUE(fs::exists(store.checkpoint(2).path()));
  EXPECT_TRUE(fs::exists(store.checkpoint(3).path()));
  EXPECT_TRUE(fs::exists(store.checkpoint(9).path()));
  for (const auto& entry : fs::directory_iterator(dir.file("checkpoints"))) {
    EXPECT_EQ(entry.path().string().find(".deleting"), std::string::npos) << entry.path();
  }
}

TEST(CheckpointStore, SupersedesLaterCheckpointsAndDiscardsOne) {
  TempDir dir;
  const CheckpointStore store(dir.file("checkpoints"), dir.file("exports"));
  save(store, 2);
  save(store, 4);
  save(store, 6);
  store.supersede_after(2);
  EXPECT_TRUE(fs::exists(store.checkpoint(2).path()));
  EXPECT_FALSE(fs::exists(store.checkpoint(4).path()));
  EXPECT_TRUE(fs::exists(dir.file("checkpoints/step_00000004.superseded")));
  EXPECT_TRUE(fs::exists(dir.file("checkpoints/step_00000006.superseded")));
  EXPECT_EQ(store.newest_valid(), store.checkpoint(2).path().string());
  store.discard(2);
  EXPECT_FALSE(fs::exists(store.checkpoint(2).path()));
  EXPECT_EQ(store.newest_valid(), "");
}

// The exports of the set-aside steps go aside too, `latest` names the step resumed from, and a
// fresh run (step 0) sets aside everything and `latest` with it.
TEST(CheckpointStore, SupersedingSetsAsideLaterExportsAndMovesLatest) {
  TempDir dir;
  const CheckpointStore store(dir.file("checkpoints"), dir.file("exports"));
  save(store, 2);
  save(store, 4);
  fs::create_directories(store.export_folder(2));
  fs::create_directories(store.export_folder(4));
  ASSERT_EQ(text_of(dir.file("checkpoints/latest")), "step_00000004");
  store.supersede_after(2);
  EXPECT_TRUE(fs::exists(store.export_folder(2)));
  EXPECT_FALSE(fs::exists(store.export_folder(4)));
  EXPECT_TRUE(fs::exists(dir.file("exports/step_00000004.superseded")));
  EXPECT_EQ(text_of(dir.file("checkpoints/latest")), "step_00000002");

  store.supersede_after(0);
  EXPECT_FALSE(fs::exists(store.checkpoint(2).path()));
  EXPECT_TRUE(fs::exists(dir.file("checkpoints/step_00000002.superseded")));
  EXPECT_TRUE(fs::exists(dir.file("exports/step_00000002.superseded")));
  EXPECT_FALSE(fs::exists(dir.file("checkpoints/latest")));
  EXPECT_EQ(store.newest_valid(), "");
  // Another history at step 2 set aside again: the first one set aside keeps its folder.
  save(store, 2);
  fs::create_directories(dir.file("checkpoints/step_00000002/first_history_marker"));
  fs::create_directories(dir.file("checkpoints/step_00000002.superseded/older_history_marker"));
  store.supersede_after(0);
  EXPECT_TRUE(fs::exists(dir.file("checkpoints/step_00000002.superseded/older_history_marker")));
  EXPECT_TRUE(fs::exists(dir.file("checkpoints/step_00000002.superseded.2/first_history_marker")));
  EXPECT_EQ(store.newest_valid(), "") << "no folder set aside is taken for this run's";
  // Nothing to set aside: nothing changes, and folders that are not there are no error.
  const CheckpointStore empty(dir.file("none/checkpoints"), dir.file("none/exports"));
  empty.supersede_after(0);
  EXPECT_FALSE(fs::exists(dir.file("none")));
}

}  // namespace checkpoint_store_test
}  // namespace tessera::core
