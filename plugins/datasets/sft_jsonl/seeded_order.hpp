// The order a dataset reads its examples in: epoch by epoch, each epoch a seeded shuffle of all
// of them (or file order), the same on every rank, so a global position names one example.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

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

}  // namespace tessera::chat
