// dataset/tokens built through the real loader and factory on token files written by the test:
// windows and labels, dtypes, ignored labels, batching, order, shards, resume and bad files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "test_support.hpp"

namespace tessera {
namespace tokens_test {

using testing::TempDir;

// Tokens 0, 1, 2, ...: every token says where it is in the file.
std::string counting_file(const TempDir& dir, std::size_t n, const std::string& name = "tokens.bin") {
  std::vector<std::uint16_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  const std::string path = dir.file(name);
  testing::write_token_file(path, tokens);
  return path;
}

std::shared_ptr<Dataset> make_dataset(const std::string& path, const std::string& config,
                                      const RunContext& context = {}) {
  auto b = testing::build_components(
      "data: {component_key: dataset, variant_key: tokens, config: {path: " + path + ", " + config + "}}\n",
      context);
  return testing::built<Dataset>(b, "data");
}

// With a counting file and no overlap, a sample's index is its first token / stride.
std::vector<std::int64_t> sample_ids(const Batch& batch, std::int64_t stride) {
  std::vector<std::int64_t> ids;
  for (std::int64_t b = 0; b < batch.input_ids.size(0); ++b) {
    ids.push_back(batch.input_ids[b][0].item<std::int64_t>() / stride);
  }
  return ids;
}

std::vector<std::int64_t> read_samples(Dataset& data, std::int64_t n, std::int64_t stride) {
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < n; ++i) {
    auto one = sample_ids(data.next_batch(1), stride);
    ids.push_back(one[0]);
  }
  return ids;
}

at::Tensor longs(std::vector<std::int64_t> values, std::int64_t rows) {
  return at::tensor(values, at::kLong).view({rows, -1});
}

void expect_same_batch(const Batch& a, const Batch& b, const std::string& what) {
  EXPECT_TRUE(a.input_ids.equal(b.input_ids)) << what;
  EXPECT_TRUE(a.labels.equal(b.labels)) << what;
  EXPECT_EQ(a.num_target_tokens, b.num_target_tokens) << what;
}

TEST(TokensDataset, WindowsAndLabelsAreShiftedByOne) {
  TempDir dir;
  auto data = make_dataset(counting_file(dir, 41), "seq_len: 4, shuffle: false");
  EXPECT_EQ(data->seq_len(), 4);
  EXPECT_EQ(data->num_samples(), 10);  // (41 - 4 - 1) / 4 + 1
  data->set_shard(0, 1);
  Batch batch = data->next_batch(3);
  ASSERT_EQ(batch.input_ids.sizes(), (at::IntArrayRef{3, 4}));
  ASSERT_EQ(batch.labels.sizes(), (at::IntArrayRef{3, 4}));
  EXPECT_EQ(batch.input_ids.scalar_type(), at::kLong);
  EXPECT_EQ(batch.labels.scalar_type(), at::kLong);
  EXPECT_EQ(batch.num_target_tokens, 12);
  for (std::int64_t b = 0; b < 3; ++b) {
    for (std::int64_t t = 0; t < 4; ++t) {
      EXPECT_EQ(batch.input_ids[b][t].item<std::int64_t>(), 4 * b + t);
      EXPECT_EQ(batch.labels[b][t].item<std::int64_t>(), 4 * b + t + 1);
    }
  }
}

TEST(TokensDataset, StrideGivesOverlappingWindows) {
  TempDir dir;
  auto data = make_dataset(counting_file(dir, 41), "seq_len: 4, stride: 2, shuffle: false");
  EXPECT_EQ(data->num_samples(), 19);  // (41 - 4 - 1) / 2 + 1
  Batch batch = data->next_batch(3);
  for (std::int64_t b = 0; b < 3; ++b) {
    EXPECT_EQ(batch.input_ids[b][0].item<std::int64_t>(), 2 * b);
    EXPECT_EQ(batch.labels[b][3].item<std::int64_t>(), 2 * b + 4);
  }
}

TEST(TokensDataset, ReadsUint32Tokens) {
  TempDir dir;
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t i = 0; i < 9; ++i) tokens.push_back(100000 + i);
  const std::string path = dir.file("wide.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
  }
  auto data = make_dataset(path, "dtype: uint32, seq_len: 4, shuffle: false");
  EXPECT_EQ(data->num_samples(), 2);
  Batch batch = data->next_batch(2);
  EXPECT_TRUE(batch.input_ids.equal(longs({100000, 100001, 100002, 100003, 100004, 100005, 100006, 100007}, 2)));
  EXPECT_TRUE(batch.labels.equal(longs({100001, 100002, 100003, 100004, 100005, 100006, 100007, 100008}, 2)));
}

TEST(TokensDataset, ReadsUint8TokensFromAnyFile) {
  TempDir dir;
  const std::string path = dir.write("text.txt", "hello, world!\n");  // 14 bytes, 14 tokens
  auto data = make_dataset(path, "dtype: uint8, seq_len: 4, shuffle: false");
  EXPECT_EQ(data->num_samples(), 3);  // (14 - 4 - 1) / 4 + 1
  Batch batch = data->next_batch(2);
  EXPECT_TRUE(batch.input_ids.equal(longs({'h', 'e', 'l', 'l', 'o', ',', ' ', 'w'}, 2)));
  EXPECT_TRUE(batch.labels.equal(longs({'e', 'l', 'l', 'o', ',', ' ', 'w', 'o'}, 2)));
}

TEST(TokensDataset, IgnoreTokenMasksLabelsOnly) {
  TempDir dir;
  const std::string path = dir.file("padded.bin");
  testing::write_token_file(path, {5, 6, 0, 0, 7, 0, 8, 9, 0});
  auto data = make_dataset(path, "seq_len: 4, ignore_token: 0, shuffle: false");
  Batch batch = data->next_batch(2);
  const auto I = kIgnoreIndex;
  EXPECT_TRUE(batch.input_ids.equal(longs({5, 6, 0, 0, 7, 0, 8, 9}, 2)));
  EXPECT_TRUE(batch.labels.equal(longs({6, I, I, 7, I, 8, 9, I}, 2)));
  EXPECT_EQ(batch.num_target_tokens, 4);
  EXPECT_EQ(batch.num_target_tokens, batch.labels.ne(kIgnoreIndex).sum().item<std::int64_t>());

  // Without ignore_token, token 0 is an ordinary label.
  auto plain = make_dataset(path, "seq_len: 4, shuffle: false");
  EXPECT_EQ(plain->next_batch(2).num_target_tokens, 8);
}

TEST(TokensDataset, SmallBatchesEqualOneBigBatch) {
  TempDir dir;
  const std::string path = counting_file(dir, 31);  // 6 samples: 8 samples cross an epoch
  auto small = make_dataset(path, "seq_len: 4, seed: 9");
  auto big = make_dataset(path, "seq_len: 4, seed: 9");
  std::vector<at::Tensor> inputs, labels;
  std::int64_t targets = 0;
  for (int i = 0; i < 4; ++i) {
    Batch b = small->next_batch(2);
    inputs.push_back(b.input_ids);
    labels.push_back(b.labels);
    targets += b.num_target_tokens;
  }
  Batch whole = big->next_batch(8);
  EXPECT_TRUE(at::cat(inputs).equal(whole.input_ids));
  EXPECT_TRUE(at::cat(labels).equal(whole.labels));
  EXPECT_EQ(targets, whole.num_target_tokens);
}

TEST(TokensDataset, NoShuffleReadsInFileOrderEveryEpoch) {
  TempDir dir;
  auto data = make_dataset(counting_file(dir, 41), "seq_len: 4, shuffle: false");
  std::vector<std::int64_t> in_order(10);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_EQ(read_samples(*data, 10, 4), in_order);
  EXPECT_EQ(read_samples(*data, 10, 4), in_order);
}

TEST(TokensDataset, ShuffleIsASeededPermutationPerEpoch) {
  TempDir dir;
  const std::string path = counting_file(dir, 49);  // 12 samples
  auto data = make_dataset(path, "seq_len: 4, seed: 3");
  const auto epoch0 = read_samples(*data, 12, 4);
  const auto epoch1 = read_samples(*data, 12, 4);
  std::vector<std::int64_t> in_order(12);
  std::iota(in_order.begin(), in_order.end(), 0);
  auto sorted0 = epoch0, sorted1 = epoch1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  EXPECT_EQ(sorted0, in_order);
  EXPECT_EQ(sorted1, in_order);
  EXPECT_NE(epoch0, in_order);
  EXPECT_NE(epoch0, epoch1) << "each epoch has its own order";

  EXPECT_EQ(read_samples(*make_dataset(path, "seq_len: 4, seed: 3"), 12, 4), epoch0);
  EXPECT_NE(read_samples(*make_dataset(path, "seq_len: 4, seed: 4"), 12, 4), epoch0);
  // seed -1 (the default) takes the run's seed.
  RunContext run;
  run.seed = 3;
  EXPECT_EQ(read_samples(*make_dataset(path, "seq_len: 4", run), 12, 4), epoch0);
}

TEST(TokensDataset, ShardsAreDisjointAndCoverAnEpoch) {
  TempDir dir;
  const std::string path = counting_file(dir, 49);  // 12 samples, 4 per rank
  std::set<std::int64_t> seen;
  std::vector<StateDict> states;
  for (std::int64_t rank = 0; rank < 3; ++rank) {
    auto data = make_dataset(path, "seq_len: 4, seed: 5");
    data->set_shard(rank, 3);
    EXPECT_EQ(data->num_samples(), 12);
    std::vector<std::int64_t> ids = sample_ids(data->next_batch(2), 4);
    for (auto id : sample_ids(data->next_batch(2), 4)) ids.push_back(id);
    for (auto id : ids) EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " read twice";
    states.push_back(data->state_dict());
  }
  EXPECT_EQ(seen.size(), 12u);
  // The cursor is shared: every rank saves the same position.
  for (std::int64_t rank = 1; rank < 3; ++rank) {
    EXPECT_TRUE(states[rank].at("epoch").equal(states[0].at("epoch")));
    EXPECT_TRUE(states[rank].at("position").equal(states[0].at("position")));
  }
  EXPECT_EQ(states[0].at("epoch").item<std::int64_t>(), 1);
  EXPECT_EQ(states[0].at("position").item<std::int64_t>(), 0);
}

TEST(TokensDataset, ResumeFromStateDictReadsWhatAnUninterruptedRunReads) {
  TempDir dir;
  const std::string path = counting_file(dir, 49);  // 12 samples; 5 batches of 3 cross an epoch
  auto uninterrupted = make_dataset(path, "seq_len: 4, seed: 2");
  std::vector<Batch> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(uninterrupted->next_batch(3));

  auto first = make_dataset(path, "seq_len: 4, seed: 2");
  first->next_batch(3);
  first->next_batch(3);
  const StateDict state = first->state_dict();
  EXPECT_EQ(state.size(), 3u);  // epoch, position and the layout they are a position in
  EXPECT_EQ(state.at("position").item<std::int64_t>(), 6);

  auto resumed = make_dataset(path, "seq_len: 4, seed: 2");
  resumed->load_state_dict(state);
  for (int i = 2; i < 5; ++i) expect_same_batch(resumed->next_batch(3), expected[i], "batch " + std::to_string(i));
}

TEST(TokensDataset, ResumeWorksPerShard) {
  TempDir dir;
  const std::string path = counting_file(dir, 49);
  auto uninterrupted = make_dataset(path, "seq_len: 4, seed: 2");
  uninterrupted->set_shard(1, 2);
  for (int i = 0; i < 3; ++i) uninterrupted->next_batch(2);
  const Batch expected = uninterrupted->next_batch(2);

  auto rank0 = make_dataset(path, "seq_len: 4, seed: 2");  // rank 0's state resumes rank 1
  rank0->set_shard(0, 2);
  for (int i = 0; i < 3; ++i) rank0->next_batch(2);
  auto resumed = make_dataset(path, "seq_len: 4, seed: 2");
  resumed->load_state_dict(rank0->state_dict());
  resumed->set_shard(1, 2);  // after load_state_dict is fine too
  expect_same_batch(resumed->next_batch(2), expected, "rank 1");
}

TEST(TokensDataset, RejectsForeignState) {
  TempDir dir;
  auto data = make_dataset(counting_file(dir, 41), "seq_len: 4");
  EXPECT_THROW(data->load_state_dict({{"epoch", at::scalar_tensor(0, at::kLong)}}), Error);
  EXPECT_THROW(data->load_state_dict({{"epoch", at::scalar_tensor(0, at::kLong)},
                                      {"position", at::scalar_tensor(10, at::kLong)}}),
               Error);  // 10 samples: position 10 is outside the epoch
  EXPECT_THROW(data->load_state_dict({{"epoch", at::scalar_tensor(0, at::kLong)},
                                      {"position", at::scalar_tensor(1, at::kLong)},
                                      {"extra", at::scalar_tensor(1, at::kLong)}}),
               Error);
}

// A state records the layout it is a position in: a resume over another file (even one of the
// same size), other windows or another order is refused, naming what was saved and what is read.
TEST(TokensDataset, AStateOfAnotherFileOrLayoutIsRefusedNamingBoth) {
  TempDir dir;
  const std::string path = counting_file(dir, 41);
  auto saved = make_dataset(path, "seq_len: 4, seed: 2");
  saved->set_shard(0, 1);
  saved->next_batch(3);
  const StateDict state = saved->state_dict();
  EXPECT_NO_THROW(make_dataset(path, "seq_len: 4, seed: 2")->load_state_dict(state));

  auto refusal = [&](const std::string& other_path, const std::string& config) {
    try {
      make_dataset(other_path, config)->load_state_dict(state);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string windows = refusal(path, "seq_len: 2, seed: 2");
  EXPECT_NE(windows.find("saved reading 41 tokens"), std::string::npos) << windows;
  EXPECT_NE(windows.find("seq_len 4, stride 4, shuffled with seed 2; this run reads"), std::string::npos) << windows;
  EXPECT_NE(windows.find("seq_len 2, stride 2"), std::string::npos) << windows;
  EXPECT_NE(windows.find("resume with the file and config it was saved with"), std::string::npos) << windows;
  EXPECT_NE(refusal(path, "seq_len: 4, seed: 3").find("shuffled with seed 3"), std::string::npos);
  EXPECT_NE(refusal(path, "seq_len: 4, seed: 2, shuffle: false").find("in file order"), std::string::npos);
  EXPECT_NE(refusal(path, "seq_len: 4, seed: 2, stride: 2").find("stride 2"), std::string::npos);
  // In file order the seed orders nothing: a state saved under one seed resumes under another.
  auto in_order = make_dataset(path, "seq_len: 4, seed: 2, shuffle: false");
  in_order->set_shard(0, 1);
  in_order->next_batch(3);
  EXPECT_NO_THROW(make_dataset(path, "seq_len: 4, seed: 5, shuffle: false")->load_state_dict(in_order->state_dict()));
  // The same number of tokens written again with other ids: told apart by the checksum.
  std::vector<std::uint16_t> rewritten(41, 7);
  const std::string other = dir.file("rewritten.bin");
  testing::write_token_file(other, rewritten);
  EXPECT_NE(refusal(other, "seq_len: 4, seed: 2").find("saved reading 41 tokens (checksum"), std::string::npos);

  // A state saved before layouts were (epoch and position only) is still read.
  auto old_state = make_dataset(path, "seq_len: 4, seed: 2");
  EXPECT_NO_THROW(old_state->load_state_dict({{"epoch", state.at("epoch")}, {"position", state.at("position")}}));
  EXPECT_TRUE(old_state->state_dict().at("position").equal(state.at("position")));
}

TEST(TokensDataset, InvalidShardOrBatchSizeThrows) {
  TempDir dir;
  auto data = make_dataset(counting_file(dir, 41), "seq_len: 4");
  EXPECT_THROW(data->set_shard(3, 3), Error);
  EXPECT_THROW(data->set_shard(-1, 3), Error);
  EXPECT_THROW(data->set_shard(0, 0), Error);
  EXPECT_THROW(data->next_batch(0), Error);
}

// Builds a dataset that must be rejected; returns the issue.
core::ConfigIssue build_issue(const std::string& path, const std::string& config) {
  try {
    make_dataset(path, config);
  } catch (const core::ConfigIssue& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConfigIssue for " << path;
  return core::ConfigIssue({}, "", "");
}

TEST(TokensDataset, BadFilesAreConfigIssuesOnPath) {
  TempDir dir;
  const std::string missing = dir.file("missing.bin");
  const std::string empty = dir.write("empty.bin", "");
  const std::string odd = dir.write("odd.bin", "12345");      // 5 bytes: not uint16
  const std::string six = dir.write("six.bin", "123456");     // 6 bytes: not uint32
  const std::string shorter = counting_file(dir, 4, "short.bin");  // fewer than seq_len + 1 tokens
  struct Case {
    std::string path, config, says;
  } cases[] = {
      {missing, "seq_len: 4", "no such file or folder: " + missing},
      {empty, "seq_len: 4", empty + " is empty"},
      {odd, "seq_len: 1", odd + " has 5 bytes, not a multiple of 2"},
      {six, "seq_len: 1, dtype: uint32", six + " has 6 bytes, not a multiple of 4"},
      {shorter, "seq_len: 4", shorter + " has 4 tokens, fewer than one window of seq_len + 1 = 5"},
  };
  for (const Case& c : cases) {
    core::ConfigIssue issue = build_issue(c.path, c.config);
    EXPECT_EQ(issue.path(), "components.data.config.path") << c.path;
    EXPECT_NE(issue.message().find(c.says), std::string::npos) << issue.what();
  }
  // The same file is fine as uint16 (3 tokens).
  EXPECT_NO_THROW(make_dataset(six, "seq_len: 2"));
}

// uint32 ids below 65536 read as uint16 are ids too (each followed by its 0 high half): without
// an index naming the dtype, such a file is refused as uint16, and read as uint32.
TEST(TokensDataset, AnUnindexedFileOfUint32IdsIsNotReadAsUint16) {
  TempDir dir;
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < 100; ++i) ids.push_back(1 + i * 7 % 500);
  const std::string path = dir.file("wide.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  }
  core::ConfigIssue issue = build_issue(path, "seq_len: 4");
  EXPECT_EQ(issue.path(), "components.data.config.path");
  EXPECT_NE(issue.message().find("looks like uint32 token ids"), std::string::npos) << issue.what();
  EXPECT_NE(issue.message().find("set dtype: uint32"), std::string::npos) << issue.what();
  EXPECT_EQ(make_dataset(path, "seq_len: 4, dtype: uint32")->num_samples(), 24);
  // A real uint16 file with many zeros (padding) is not taken for one.
  std::vector<std::uint16_t> padded(200, 0);
  for (std::size_t i = 0; i < padded.size(); i += 3) padded[i] = 5;
  testing::write_token_file(dir.file("padded.bin"), padded);
  EXPECT_NO_THROW(make_dataset(dir.file("padded.bin"), "seq_len: 4"));
}

// document_mask: each position's document is the number of EOS before it in the window.
TEST(TokensDataset, DocumentIdsCountTheEosBeforeEachPosition) {
  TempDir dir;
  std::vector<std::uint16_t> tokens = {5, 6, 0, 7, 0, 0, 8, 9, 10, 11, 12};
  const std::string path = dir.file("docs.bin");
  testing::write_token_file(path, tokens);
  auto data = make_dataset(path, "seq_len: 5, shuffle: false, document_mask: true, eos_id: 0");
  data->set_shard(0, 1);
  const Batch batch = data->next_batch(2);
  ASSERT_TRUE(batch.document_ids.defined());
  EXPECT_TRUE(batch.document_ids.equal(longs({0, 0, 0, 1, 1, 0, 1, 1, 1, 1}, 2)));
  // Without it: none; with it but no EOS known: a config error at eos_id.
  EXPECT_FALSE(make_dataset(path, "seq_len: 5")->next_batch(1).document_ids.defined());
  try {
    make_dataset(path, "seq_len: 5, document_mask: true");
    FAIL() << "expected a config error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("eos_id"), std::string::npos) << e.what();
  }
}

}  // namespace tokens_test
}  // namespace tessera
