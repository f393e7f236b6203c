#include "mixture.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>

#include "tessera/error.hpp"
#include "token_windows.hpp"

namespace tessera::token_data {
namespace {

class Mixture final : public Dataset {
 public:
  Mixture(const MixtureConfig& c, std::uint64_t run_seed) : seq_len_(c.seq_len) {
    double sum = 0;
    for (double w : c.weights) sum += w;
    const std::uint64_t seed = c.seed < 0 ? run_seed : static_cast<std::uint64_t>(c.seed);
    for (std::size_t i = 0; i < c.paths.size(); ++i) {
      TokensConfig member;
      member.path = c.paths[i];
      member.dtype = c.dtype;
      member.seq_len = c.seq_len;
      member.stride = c.stride;
      member.ignore_token = c.ignore_token;
      member.shuffle = c.shuffle;
      member.seed = static_cast<std::int64_t>(seed + i);
      try {
        members_.push_back(std::make_unique<TokenWindowDataset>(member, seed + i));
      } catch (const ConfigError& e) {
        throw ConfigError(std::string(e.what()), "paths");
      }
      weights_.push_back(c.weights[i] / sum);
      // A member of weight 0 is never drawn: its samples are not the mixture's.
      if (c.weights[i] > 0) num_samples_ += members_.back()->num_samples();
    }
    drawn_.assign(members_.size(), 0);
  }

  void set_shard(std::int64_t rank, std::int64_t world_size) override {
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      throw Error("dataset/mixture: invalid shard rank " + std::to_string(rank) + " of world size " +
                  std::to_string(world_size));
    }
    rank_ = rank;
    world_size_ = world_size;
  }

  Batch next_batch(std::int64_t batch_size) override {
    if (batch_size < 1) throw Error("dataset/mixture: batch size must be >= 1, got " + std::to_string(batch_size));
    at::Tensor input = at::empty({batch_size, seq_len_}, at::kLong);
    at::Tensor labels = at::empty({batch_size, seq_len_}, at::kLong);
    std::int64_t* in = input.mutable_data_ptr<std::int64_t>();
    std::int64_t* out = labels.mutable_data_ptr<std::int64_t>();
    std::int64_t targets = 0;
    for (std::int64_t b = 0; b < batch_size; ++b) {
      // Every rank walks the same global positions, so every rank's counts stay the same; it
      // reads only its own.
      for (std::int64_t r = 0; r < world_size_; ++r) {
        const std::size_t m = next_member();
        const std::int64_t draw = drawn_[m]++;
        if (r == rank_) targets += members_[m]->write_draw(draw, in + b * seq_len_, out + b * seq_len_);
        ++position_;
      }
    }
    return {std::move(input), std::move(labels), targets};
  }

  std::int64_t seq_len() const override { return seq_len_; }
  std::int64_t num_samples() const override { return num_samples_; }

  StateDict state_dict() const override {
    std::vector<std::int64_t> layouts;
    for (const auto& member : members_) {
      const auto values = member->layout().values();
      layouts.insert(layouts.end(), values.begin(), values.end());
    }
    return {{"position", at::scalar_tensor(position_, at::kLong)},
            {"drawn", at::tensor(drawn_, at::kLong)},
            {"layouts", at::tensor(layouts, at::kLong).view({-1, WindowLayout::kValues})}};
  }

  void load_state_dict(const StateDict& state) override {
    const auto position = state.find("position");
    const auto drawn = state.find("drawn");
    const auto layouts = state.find("layouts");
    const std::size_t keys = layouts == state.end() ? 2 : 3;  // a state from before layouts were saved has none
    if (position == state.end() || drawn == state.end() || state.size() != keys) {
      throw Error("dataset/mixture state: expected exactly the keys position, drawn and layouts");
    }
    const at::Tensor counts = drawn->second.to(at::kLong).contiguous();
    if (counts.dim() != 1 || counts.numel() != static_cast<std::int64_t>(members_.size())) {
      throw Error("dataset/mixture state: " + std::to_string(counts.numel()) + " member counts for " +
                  std::to_string(members_.size()) + " members (were paths changed?)");
    }
    if (layouts != state.end()) {
      const at::Tensor saved = layouts->second.to(at::kLong).contiguous();
      if (saved.dim() != 2 || saved.size(0) != counts.numel() || saved.size(1) != WindowLayout::kValues) {
        throw Error("dataset/mixture state: the layouts are not one row of " + std::to_string(WindowLayout::kValues) +
                    " values per member");
      }
      for (std::size_t i = 0; i < members_.size(); ++i) {
        check_saved_layout({{"layout", saved[static_cast<std::int64_t>(i)]}}, members_[i]->layout(),
                           "dataset/mixture member " + std::to_string(i) + " (" + members_[i]->path() + ")");
      }
    }
    std::int64_t total = 0;
    for (std::int64_t i = 0; i < counts.numel(); ++i) {
      const std::int64_t count = counts[i].item<std::int64_t>();
      // A negative count would index a member's order before its start.
      if (count < 0) throw Error("dataset/mixture state: member " + std::to_string(i) + " has a negative count");
      total += count;
    }
    if (total != position->second.item<std::int64_t>()) {
      throw Error("dataset/mixture state: the member counts do not add up to the position");
    }
    position_ = total;
    for (std::size_t i = 0; i < members_.size(); ++i) drawn_[i] = counts[static_cast<std::int64_t>(i)].item<std::int64_t>();
  }

 private:
  // The member with the largest deficit against its share after one more sample (the first
  // among equals): every member's count stays within one of weight x samples.
  std::size_t next_member() const {
    std::size_t best = 0;
    double best_deficit = -1e300;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      const double deficit = weights_[i] * static_cast<double>(position_ + 1) - static_cast<double>(drawn_[i]);
      if (weights_[i] > 0 && deficit > best_deficit) best_deficit = deficit, best = i;
    }
    return best;
  }

  std::int64_t seq_len_;
  std::vector<std::unique_ptr<TokenWindowDataset>> members_;
  std::vector<double> weights_;
  std::vector<std::int64_t> drawn_;  // samples each member has given, all ranks together
  std::int64_t position_ = 0;        // global samples drawn, all ranks together
  std::int64_t num_samples_ = 0;
  std::int64_t rank_ = 0, world_size_ = 1;
};

}  // namespace

std::shared_ptr<Dataset> make_mixture(const MixtureConfig& config, std::uint64_t run_seed) {
  return std::make_shared<Mixture>(config, run_seed);
}

}  // namespace tessera::token_data
