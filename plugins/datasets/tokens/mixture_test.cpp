// dataset/mixture built through the real loader and factory on token files written by the test:
// the members' shares match the weights within one sample at every length, every member keeps its
// own seeded order, ranks split the same global sequence, resume mid-mixture is exact, and the
// configs and states it refuses.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "test_support.hpp"

namespace tessera {
namespace mixture_test {

using testing::TempDir;

// Member i's file holds tokens 1000·i + 0, 1, 2, ...: a sample's first token names its member
// and its place.
std::string member_file(const TempDir& dir, int member, std::size_t n) {
  std::vector<std::uint16_t> tokens(n);
  for (std::size_t t = 0; t < n; ++t) tokens[t] = static_cast<std::uint16_t>(1000 * member + t);
  const std::string path = dir.file("member" + std::to_string(member) + ".bin");
  testing::write_token_file(path, tokens);
  return path;
}

std::shared_ptr<Dataset> make_mixture(const TempDir& dir, const std::string& weights, const std::string& extra = "") {
  auto b = testing::build_components("data: {component_key: dataset, variant_key: mixture, config: {paths: [" +
                                     member_file(dir, 0, 400) + ", " + member_file(dir, 1, 300) + ", " +
                                     member_file(dir, 2, 200) + "], weights: " + weights + ", seq_len: 4" + extra +
                                     "}}\n");
  return testing::built<Dataset>(b, "data");
}

// The first token of every sample of the next `n` batches of `size`.
std::vector<std::int64_t> firsts(Dataset& data, std::int64_t n, std::int64_t size) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < n; ++i) {
    const Batch batch = data.next_batch(size);
    for (std::int64_t b = 0; b < size; ++b) out.push_back(batch.input_ids[b][0].item<std::int64_t>());
  }
  return out;
}

TEST(Mixture, SharesMatchTheWeightsWithinOneSampleAtEveryLength) {
  TempDir dir;
  auto data = make_mixture(dir, "[5, 3, 2]");  // normalised: 0.5, 0.3, 0.2
  data->set_shard(0, 1);
  const auto samples = firsts(*data, 100, 10);
  std::map<int, std::int64_t> count;
  for (std::size_t n = 0; n < samples.size(); ++n) {
    ++count[static_cast<int>(samples[n] / 1000)];
    const double seen = static_cast<double>(n + 1);
    EXPECT_LE(std::abs(count[0] - 0.5 * seen), 1.0) << "after " << n + 1;
    EXPECT_LE(std::abs(count[1] - 0.3 * seen), 1.0) << "after " << n + 1;
    EXPECT_LE(std::abs(count[2] - 0.2 * seen), 1.0) << "after " << n + 1;
  }
  EXPECT_EQ(count[0], 500);
  EXPECT_EQ(count[1], 300);
  EXPECT_EQ(count[2], 200);
  // Member 2 has 200 / 4 = 49 windows: its 200 samples went through it four times, each epoch
  // in a new order, every window once per epoch.
  std::map<std::int64_t, int> windows;
  for (auto s : samples) {
    if (s / 1000 == 2) ++windows[s];
  }
  EXPECT_EQ(windows.size(), 49u);
}

TEST(Mixture, TwoRanksReadTheOneRankSequenceBetweenThem) {
  TempDir dir;
  auto one = make_mixture(dir, "[1, 1, 2]");
  one->set_shard(0, 1);
  const auto all = firsts(*one, 6, 4);
  TempDir dir0, dir1;
  auto rank0 = make_mixture(dir0, "[1, 1, 2]");
  auto rank1 = make_mixture(dir1, "[1, 1, 2]");
  rank0->set_shard(0, 2);
  rank1->set_shard(1, 2);
  const auto a = firsts(*rank0, 6, 2), b = firsts(*rank1, 6, 2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i], all[2 * i]) << i;
    EXPECT_EQ(b[i], all[2 * i + 1]) << i;
  }
}

TEST(Mixture, ResumeMidMixtureIsExact) {
  TempDir dir;
  auto straight = make_mixture(dir, "[2, 1, 1]");
  straight->set_shard(0, 1);
  const auto expected = firsts(*straight, 12, 3);

  auto first = make_mixture(dir, "[2, 1, 1]");
  first->set_shard(0, 1);
  const auto before = firsts(*first, 7, 3);
  const StateDict state = first->state_dict();
  auto resumed = make_mixture(dir, "[2, 1, 1]");
  resumed->load_state_dict(state);
  resumed->set_shard(0, 1);
  auto after = firsts(*resumed, 5, 3);
  std::vector<std::int64_t> joined = before;
  joined.insert(joined.end(), after.begin(), after.end());
  EXPECT_EQ(joined, expected);
}

// Weights may change between a save and a resume (a data schedule): the saved counts go on
// toward the new shares. A member file written again is refused, naming the member.
TEST(Mixture, AResumeMayChangeTheWeightsButNotTheFiles) {
  TempDir dir;
  auto first = make_mixture(dir, "[1, 1, 0]");
  first->set_shard(0, 1);
  firsts(*first, 10, 3);  // 30 samples: 15 and 15
  const StateDict state = first->state_dict();
  auto reweighted = make_mixture(dir, "[1, 1, 2]");  // writes the same member files again
  reweighted->load_state_dict(state);
  reweighted->set_shard(0, 1);
  std::map<int, std::int64_t> count;
  for (auto s : firsts(*reweighted, 10, 3)) ++count[static_cast<int>(s / 1000)];
  // After 60 samples the shares are 15, 15, 30: the 30 new ones all come from member 2.
  EXPECT_EQ(count[2], 30);

  std::vector<std::uint16_t> other(300, 9);  // member 1 written again, same length
  testing::write_token_file(dir.file("member1.bin"), other);
  auto changed = testing::build_components(
      "data: {component_key: dataset, variant_key: mixture, config: {paths: [" + dir.file("member0.bin") + ", " +
      dir.file("member1.bin") + ", " + dir.file("member2.bin") + "], weights: [1, 1, 0], seq_len: 4}}\n");
  try {
    testing::built<Dataset>(changed, "data")->load_state_dict(state);
    ADD_FAILURE() << "a state over another member file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset/mixture member 1 (" + dir.file("member1.bin") + ") state was saved reading"),
              std::string::npos)
        << e.what();
  }
}

TEST(Mixture, ZeroWeightMembersAreNotCountedInItsSamples) {
  TempDir dir;
  // Windows of 4 tokens: 400 tokens -> 99, 300 -> 74, 200 -> 49.
  EXPECT_EQ(make_mixture(dir, "[1, 1, 1]")->num_samples(), 99 + 74 + 49);
  EXPECT_EQ(make_mixture(dir, "[1, 0, 1]")->num_samples(), 99 + 49);
}

TEST(Mixture, BadConfigsAndStatesAreRefused) {
  TempDir dir;
  auto message = [&](const std::string& weights) {
    try {
      make_mixture(dir, weights);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[1, 1]").find("weights has 2 entries for 3 paths"), std::string::npos);
  EXPECT_NE(message("[1, -1, 1]").find("negative"), std::string::npos);
  EXPECT_NE(message("[0, 0, 0]").find("all be zero"), std::string::npos);
  EXPECT_NE(message("[1, .inf, 1]").find("finite"), std::string::npos) << message("[1, .inf, 1]");
  auto data = make_mixture(dir, "[1, 1, 1]");
  EXPECT_THROW(data->load_state_dict({{"position", at::scalar_tensor(3, at::kLong)},
                                      {"drawn", at::tensor({1, 1}, at::kLong)}}),
               Error);
  EXPECT_THROW(data->load_state_dict({{"position", at::scalar_tensor(5, at::kLong)},
                                      {"drawn", at::tensor({1, 1, 1}, at::kLong)}}),
               Error);
  // Counts that add up to the position but one is negative: refused, not read before the start.
  try {
    data->load_state_dict({{"position", at::scalar_tensor(0, at::kLong)}, {"drawn", at::tensor({-1, 1, 0}, at::kLong)}});
    ADD_FAILURE() << "a negative count was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("member 0 has a negative count"), std::string::npos) << e.what();
  }
}

}  // namespace mixture_test
}  // namespace tessera
