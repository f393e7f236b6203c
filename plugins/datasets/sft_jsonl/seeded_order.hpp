// How the JSON-lines datasets read their rows: the order (epoch by epoch, each a seeded shuffle
// of all of them or file order, the same on every rank, so a global position names one example),
// the rank's share, and the layout a saved position is a position in.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/formats/crc32c.hpp"

namespace tessera::chat {

class SeededOrder {
 public:
  SeededOrder(bool shuffle, std::uint64_t seed) : shuffle_(shuffle), seed_(seed) {}

  // The example at global position `global` of `count`: epoch global / count, in its order.
  std::size_t at(std::int64_t global, std::int64_t count) {
    const std::int64_t epoch = global / count;
    if (epoch != epoch_ || static_cast<std::int64_t>(order_.size()) != count) {
      order_.resize(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i) order_[static_cast<std::size_t>(i)] = static_cast<std::size_t>(i);
      if (shuffle_) {
        std::seed_seq seq{static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32),
                          static_cast<std::uint32_t>(epoch)};
        std::mt19937_64 rng(seq);
        for (std::size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[rng() % (i + 1)]);
      }
      epoch_ = epoch;
    }
    return order_[static_cast<std::size_t>(global % count)];
  }

 private:
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t epoch_ = -1;
  std::vector<std::size_t> order_;
};

// This rank's share: examples rank, rank + world, ... of the global order.
struct Shard {
  std::int64_t rank = 0, world = 1;
  void set(std::int64_t r, std::int64_t w, const std::string& dataset) {
    if (w < 1 || r < 0 || r >= w) {
      throw tessera::Error(dataset + ": invalid shard rank " + std::to_string(r) + " of " + std::to_string(w));
    }
    rank = r;
    world = w;
  }
};

// What a saved position is a position in: {rows, seq_len, shuffle, seed (only when it orders the
// rows), CRC-32C of every row's inputs and labels}; `Row` has `inputs` and `labels` vectors.
template <class Rows>
std::vector<std::int64_t> layout_of(const Rows& rows, std::int64_t count, std::int64_t seq_len, bool shuffle,
                                    std::uint64_t seed) {
  std::uint32_t crc = 0;
  for (const auto& r : rows) {
    crc = tessera::crc32c(r.inputs.data(), r.inputs.size() * sizeof(std::int64_t), crc);
    crc = tessera::crc32c(r.labels.data(), r.labels.size() * sizeof(std::int64_t), crc);
  }
  return {count, seq_len, shuffle ? 1 : 0, shuffle ? static_cast<std::int64_t>(seed) : 0, static_cast<std::int64_t>(crc)};
}

}  // namespace tessera::chat
