// core::PrefetchingDataset around the real tokens dataset: the batches are the inner dataset's,
// in order; the state is that of the first batch not yet taken, however far the reader ran
// ahead; loading a state rewinds exactly; a reading error reaches the caller with the batch.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tessera/core/train/prefetching_dataset.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "test_support.hpp"

namespace tessera {
namespace prefetching_dataset_test {

using core::PrefetchingDataset;
using testing::TempDir;

std::shared_ptr<Dataset> tokens_dataset(const std::string& path) {
  auto built = testing::build_components("data: {component_key: dataset, variant_key: tokens, config: {path: " + path +
                                         ", seq_len: 8, shuffle: true, seed: 3}}\n");
  return testing::built<Dataset>(built, "data");
}

std::string token_file(const TempDir& dir) {
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 200; ++i) tokens.push_back(static_cast<std::uint16_t>(i * 7 % 251));
  const std::string path = dir.file("tokens.bin");
  testing::write_token_file(path, tokens);
  return path;
}

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_TRUE(a.input_ids.equal(b.input_ids));
  EXPECT_TRUE(a.labels.equal(b.labels));
  EXPECT_EQ(a.num_target_tokens, b.num_target_tokens);
}

void expect_same_state(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, value] : a) EXPECT_TRUE(value.equal(b.at(key))) << key;
}

// Several epochs' worth of batches (a new shuffled order each epoch), two ranks' shards.
TEST(PrefetchingDataset, GivesTheInnerBatchesInOrderAndTheStateOfTheNextOne) {
  TempDir dir;
  const std::string path = token_file(dir);
  for (const std::int64_t depth : {1, 2, 5}) {
    SCOPED_TRACE("depth " + std::to_string(depth));
    auto reference = tokens_dataset(path);
    reference->set_shard(1, 2);
    PrefetchingDataset prefetching(tokens_dataset(path), depth, /*pin_memory=*/false);
    prefetching.set_shard(1, 2);
    for (int i = 0; i < 12; ++i) {
      // Give the reader time to run ahead as far as it may.
      std::this_thread::sleep_for(std::chrono::milliseconds(i % 3 == 0 ? 5 : 0));
      expect_same_state(prefetching.state_dict(), reference->state_dict());
      expect_same_batch(prefetching.next_batch(3), reference->next_batch(3));
    }
  }
}

// A state saved while batches were queued resumes at the first one not taken, in a new
// prefetching dataset and in the same one (which drops what it had read ahead).
TEST(PrefetchingDataset, LoadingAStateRewindsPastWhatWasReadAhead) {
  TempDir dir;
  const std::string path = token_file(dir);
  PrefetchingDataset first(tokens_dataset(path), 4, false);
  first.set_shard(0, 1);
  for (int i = 0; i < 5; ++i) first.next_batch(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the queue fills
  const StateDict saved = first.state_dict();
  std::vector<Batch> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(first.next_batch(2));

  PrefetchingDataset resumed(tokens_dataset(path), 2, false);
  resumed.set_shard(0, 1);
  resumed.load_state_dict(saved);
  for (const Batch& b : expected) expect_same_batch(resumed.next_batch(2), b);

  first.load_state_dict(saved);
  for (const Batch& b : expected) expect_same_batch(first.next_batch(2), b);
}

// Another batch size (an evaluation reading through the same object) is served in order too.
TEST(PrefetchingDataset, AnotherBatchSizeContinuesWhereTheTakenBatchesEnded) {
  TempDir dir;
  const std::string path = token_file(dir);
  auto reference = tokens_dataset(path);
  reference->set_shard(0, 1);
  PrefetchingDataset prefetching(tokens_dataset(path), 3, false);
  prefetching.set_shard(0, 1);
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  expect_same_batch(prefetching.next_batch(5), reference->next_batch(5));
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
}

// The inner dataset fails on its third batch, or on the third reading of its state (the reader
// reads it before each batch): the first two batches arrive, the third raises the dataset's own
// error in the caller, and the dataset can be read again afterwards.
class FailingDataset final : public Dataset {
 public:
  enum class FailIn { next_batch, state_dict };
  explicit FailingDataset(std::shared_ptr<Dataset> inner, FailIn where = FailIn::next_batch)
      : inner_(std::move(inner)), where_(where) {}
  void set_shard(std::int64_t rank, std::int64_t world) override { inner_->set_shard(rank, world); }
  Batch next_batch(std::int64_t n) override {
    if (where_ == FailIn::next_batch && ++calls_ == 3) throw Error("disk on fire");
    return inner_->next_batch(n);
  }
  std::int64_t seq_len() const override { return inner_->seq_len(); }
  std::int64_t num_samples() const override { return inner_->num_samples(); }
  StateDict state_dict() const override {
    if (where_ == FailIn::state_dict && ++calls_ == 3) throw Error("disk on fire");
    return inner_->state_dict();
  }
  void load_state_dict(const StateDict& s) override { inner_->load_state_dict(s); }

 private:
  std::shared_ptr<Dataset> inner_;
  FailIn where_;
  mutable int calls_ = 0;
};

TEST(PrefetchingDataset, AReadingErrorArrivesWithItsBatch) {
  TempDir dir;
  const std::string path = token_file(dir);
  auto reference = tokens_dataset(path);
  reference->set_shard(0, 1);
  PrefetchingDataset prefetching(std::make_shared<FailingDataset>(tokens_dataset(path)), 2, false);
  prefetching.set_shard(0, 1);
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
  EXPECT_THROW(
      {
        try {
          prefetching.next_batch(2);
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(), "disk on fire");
          throw;
        }
      },
      Error);
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
}

// The reader could not even read the inner state before a batch: the caller gets that error (not
// one from rewinding to a state that was never read), and the dataset neither hangs when asked
// for its state nor loses its place: the next batch is the third.
TEST(PrefetchingDataset, AStateThatCannotBeReadArrivesAsTheErrorAndTheDatasetGoesOn) {
  TempDir dir;
  const std::string path = token_file(dir);
  auto reference = tokens_dataset(path);
  reference->set_shard(0, 1);
  PrefetchingDataset prefetching(
      std::make_shared<FailingDataset>(tokens_dataset(path), FailingDataset::FailIn::state_dict), 2, false);
  prefetching.set_shard(0, 1);
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
  try {
    prefetching.next_batch(2);
    ADD_FAILURE() << "expected the reading error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "disk on fire");
  }
  expect_same_state(prefetching.state_dict(), reference->state_dict());
  expect_same_batch(prefetching.next_batch(2), reference->next_batch(2));
}

}  // namespace prefetching_dataset_test
}  // namespace tessera
