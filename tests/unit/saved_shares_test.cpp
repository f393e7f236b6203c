// Saved shares (tessera/parallel/saved_shares.hpp): every tensor-parallel kind saved by a mesh of
// tp 2 whose parts are each shared unevenly over three data-parallel ranks (one share empty), in
// any order, comes back whole exactly, and is cut again for one rank and for another tp rank as
// the tensor-parallel split cuts it; a missing piece or part is an error, never zeros.
#include "tessera/parallel/saved_shares.hpp"

#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"

namespace tessera {
namespace saved_shares_test {

at::Tensor counting(std::vector<std::int64_t> shape) {
  std::int64_t n = 1;
  for (const auto s : shape) n *= s;
  return at::arange(n, at::kFloat).reshape(shape);
}

struct Kind {
  std::string name;
  at::Tensor whole;
  TensorShard shard;
};

// [out, in] by columns, by rows, a fused q|k|v of three blocks, a vocabulary of 7 rows padded to
// a multiple of 2 per rank, stacked experts, a replicated norm.
std::vector<Kind> kinds() {
  return {{"col", counting({4, 3}), TensorShard::columns()},
          {"row", counting({3, 4}), TensorShard::rows()},
          {"qkv", counting({6, 2}), TensorShard::columns(3)},
          {"vocab", counting({7, 2}), TensorShard::vocabulary(7, 2)},
          {"experts", counting({4, 2, 3}), TensorShard::expert_stack()},
          {"norm", counting({3}), TensorShard{}}};
}

Placement placed(const Kind& k, ShardRanks part) {
  Placement p;
  p.shard = k.shard;
  p.part = k.shard.replicated() ? ShardRanks{} : part;
  p.whole_shape = k.whole.sizes().vec();
  return p;
}

// Part `part` of 2 as a mesh of tp 2 saves it: shared over three ranks, [0, a), [a, a) and [a, n).
std::vector<SavedShare> saved_by_tp2(const Kind& k) {
  std::vector<SavedShare> shares;
  const std::int64_t parts = k.shard.replicated() ? 1 : 2;
  for (std::int64_t r = 0; r < parts; ++r) {
    const Placement p = placed(k, {r, parts});
    const at::Tensor local = part_of(k.whole, p.shard, p.part);
    const at::Tensor flat = local.reshape({-1});
    const std::int64_t n = flat.numel(), a = n / 2 + 1;
    for (const auto& [begin, end] : std::vector<std::pair<std::int64_t, std::int64_t>>{{a, n}, {a, a}, {0, a}}) {
      SavedShare s;
      if (!k.shard.replicated()) s.layout = layout_of(p, local.sizes());
      s.begin = begin;
      s.end = end;
      s.local_numel = n;
      s.values = flat.narrow(0, begin, end - begin).clone();
      shares.push_back(s);
    }
  }
  return shares;
}

TEST(SavedShares, EveryKindComesBackWholeAndIsCutForAnotherMesh) {
  for (const Kind& k : kinds()) {
    const at::Tensor whole = join_saved_shares(saved_by_tp2(k));
    ASSERT_TRUE(at::equal(whole, k.whole.reshape({-1}))) << k.name;
    // One rank: whole, but a padded vocabulary keeps its padding row.
    const at::Tensor one = part_of_whole(whole, placed(k, {0, 1}));
    EXPECT_TRUE(at::equal(one, part_of(k.whole, k.shard, {0, 1}).reshape({-1}))) << k.name;
    EXPECT_EQ(one.numel(), k.name == "vocab" ? 16 : k.whole.numel()) << k.name;
    // Rank 1 of 2: its half.
    EXPECT_TRUE(at::equal(part_of_whole(whole, placed(k, {1, 2})), part_of(k.whole, k.shard, {1, 2}).reshape({-1})))
        << k.name;
  }
}

// A vocabulary already a multiple of its padding is not cut on one rank (Placement::cut).
TEST(SavedShares, AVocabularyOfExactlyItsPaddedSizeIsWholeOnOneRank) {
  const Kind vocab{"vocab8", counting({8, 2}), TensorShard::vocabulary(8, 2)};
  const Placement one = placed(vocab, {0, 1});
  EXPECT_FALSE(one.cut());
  EXPECT_TRUE(at::equal(part_of_whole(vocab.whole, one), vocab.whole.reshape({-1})));
  EXPECT_TRUE(placed(kinds()[3], {0, 1}).cut()) << "7 rows padded to 8 are cut";
}

TEST(SavedShares, AMissingPieceOrPartIsAnErrorNeverZeros) {
  const Kind col = kinds().front();
  std::vector<SavedShare> shares = saved_by_tp2(col);
  std::vector<SavedShare> hole(shares.begin() + 1, shares.end());  // part 0's [a, n) lost
  try {
    join_saved_shares(hole);
    FAIL() << "a hole was filled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has saved parts that cover"), std::string::npos) << e.what();
  }
  std::vector<SavedShare> one_part(shares.begin(), shares.begin() + 3);  // part 1 lost
  try {
    join_saved_shares(one_part);
    FAIL() << "a part was missing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("saved in 2 parts, 1 were found"), std::string::npos) << e.what();
  }
  std::vector<SavedShare> overlap = shares;
  overlap.push_back(shares.front());
  EXPECT_THROW(join_saved_shares(overlap), Error);
  EXPECT_THROW(part_of_whole(at::zeros({5}), placed(col, {0, 2})), Error) << "a whole of another size";
}

}  // namespace saved_shares_test
}  // namespace tessera
