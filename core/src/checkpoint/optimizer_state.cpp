#include "tessera/core/checkpoint/optimizer_state.hpp"

#include <ATen/ops/tensor.h>

#include "tessera/core/checkpoint/reshard.hpp"
#include "tessera/parallel/saved_shares.hpp"

namespace tessera::core {
namespace {

// Each parameter's share of its optimizer state (Placement::state).
std::vector<std::pair<std::int64_t, std::int64_t>> state_ranges(const OptimizerPlacements& placed) {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (std::size_t i = 0; i < placed.size(); ++i) {
    ranges.emplace_back(placed[i].placement.state.begin, placed[i].placement.state.end);
  }
  return ranges;
}

std::vector<Placement> placements_of(const OptimizerPlacements& placed) {
  std::vector<Placement> all;
  for (std::size_t i = 0; i < placed.size(); ++i) all.push_back(placed[i].placement);
  return all;
}

std::vector<std::string> names_of(const OptimizerPlacements& placed) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < placed.size(); ++i) names.push_back(placed[i].name);
  return names;
}

}  // namespace

void capture_optimizer_state(CheckpointState& st, const PlacedOptimizer& o) {
  st.optimizer_sharded = o.strategy.shards_optimizer_state();
  std::vector<bool> writes;
  for (std::size_t i = 0; i < o.placed.size(); ++i) {
    writes.push_back(o.placed.model().writes_state(o.placed[i].placement));
    st.write_optimizer = st.write_optimizer || writes.back();
  }
  if (!st.write_optimizer) return;
  const auto params = o.optimizer.parameters();
  const auto ranges = state_ranges(o.placed);
  // A Stateful's state_dict() is already a copy (tessera/run/stateful.hpp): only device tensors move.
  for (auto& [key, t] : o.optimizer.state_dict()) {
    const long long index = optimizer_param_index(key);
    if (index < 0 || writes[static_cast<std::size_t>(index)]) st.optimizer[key] = t.detach().to(at::kCPU);
  }
  const bool layouts = o.placed.model().cuts_any();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!writes[i]) continue;
    // Its name beside its index: a checkpoint resumes under another pipeline split, whose
    // optimizers number their parameters otherwise.
    const std::string key = "param." + std::to_string(i);
    const OptimizerPlacements::Parameter& placed = o.placed[i];
    if (!placed.name.empty()) st.optimizer_names[key] = placed.name;
    st.optimizer_ranges[key] = at::tensor({ranges[i].first, ranges[i].second, params[i].numel()}, at::kLong);
    if (layouts) st.optimizer_layouts[key] = layout_of(placed.placement, params[i].sizes());
  }
}

void restore_optimizer_state(StateDict whole, const std::vector<std::string>& saved_names, const PlacedOptimizer& o,
                             bool pipeline, const std::string& checkpoint_path, const std::string& model) {
  if (saved_names.empty() && pipeline && !whole.empty()) {
    // Saved before optimizer state carried names: its indices are a whole model's, not a stage's.
    throw CheckpointError("checkpoint " + checkpoint_path + " numbers its optimizer state by position only (written "
                          "by an older Tessera), which a pipeline stage cannot map to its parameters; resume it "
                          "with parallelism.pp: 1 once and save again");
  }
  if (!saved_names.empty()) {
    for (std::size_t i = 0; i < o.placed.size(); ++i) {
      if (o.placed[i].name.empty()) {
        throw Error("trainer: the optimizer's parameter " + std::to_string(i) + " is not among " + model +
                    "'s named parameters, so its state cannot be found by name in " + checkpoint_path);
      }
    }
    try {
      whole = optimizer_state_by_index(whole, saved_names, names_of(o.placed));
    } catch (const CheckpointError& e) {
      throw CheckpointError("checkpoint " + checkpoint_path + ": " + e.what());
    }
  }
  // The whole parameters' state cut to this rank's parts, then to its ranges.
  const auto params = o.optimizer.parameters();
  const StateDict local = shard_part(whole, placements_of(o.placed));
  if (o.strategy.shards_optimizer_state()) {
    const auto ranges = state_ranges(o.placed);
    StateDict mine = optimizer_state_for(local, params, &ranges);
    o.strategy.with_owned_parameters([&] { o.optimizer.load_state_dict(mine); });
  } else {
    o.optimizer.load_state_dict(optimizer_state_for(local, params, nullptr));
  }
}

}  // namespace tessera::core
