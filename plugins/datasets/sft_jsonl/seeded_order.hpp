// How the JSON-lines datasets read their rows: the order (epoch by epoch, each a seeded shuffle
// of all of them or file order, the same on every rank, so a global position names one example),
// the rank's share, and the layout a saved position is a position in.
#pragma once

#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/run/stateful.hpp"

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

// A global position as a dataset's state: its epoch, its place in an epoch of `count`, and the
// layout it is a position in.
inline tessera::StateDict position_state(std::int64_t cursor, std::int64_t count, const std::vector<std::int64_t>& layout) {
  return {{"epoch", at::scalar_tensor(cursor / count, at::kLong)},
          {"position", at::scalar_tensor(cursor % count, at::kLong)},
          {"layout", at::tensor(layout, at::kLong)}};
}

// The global position `state` holds. tessera::Error led by `dataset` for other keys, a position
// outside an epoch, or a layout other than `layout`: a position saved over other `items` (what
// `causes` says may differ) would pick ones the run has not seen.
inline std::int64_t position_from_state(const tessera::StateDict& state, std::int64_t count,
                                        const std::vector<std::int64_t>& layout, const std::string& dataset,
                                        const std::string& items, const std::string& causes) {
  const auto epoch = state.find("epoch"), position = state.find("position"), saved = state.find("layout");
  if (epoch == state.end() || position == state.end() || saved == state.end() || state.size() != 3) {
    throw tessera::Error(dataset + " state: expected exactly the keys epoch, position and layout");
  }
  const at::Tensor was = saved->second.to(at::kLong).contiguous();
  if (std::vector<std::int64_t>(was.const_data_ptr<std::int64_t>(), was.const_data_ptr<std::int64_t>() + was.numel()) !=
      layout) {
    throw tessera::Error(dataset + " state was saved reading other " + items + " (" + causes + "): its position would "
                         "pick " + items + " the run has not seen. Resume with what it was saved with, or start a new "
                         "run from the checkpoint's weights");
  }
  const auto e = epoch->second.item<std::int64_t>(), p = position->second.item<std::int64_t>();
  if (e < 0 || p < 0 || p >= count) throw tessera::Error(dataset + " state: position outside an epoch");
  return e * count + p;
}

}  // namespace tessera::chat
