#include "tessera/core/checkpoint/reshard.hpp"

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "tessera/core/checkpoint/checkpoint_state.hpp"

namespace tessera::core {

long long optimizer_param_index(const std::string& key) {
  if (key.rfind("param.", 0) != 0) return -1;
  const auto dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6) return -1;
  for (std::size_t i = 6; i < dot; ++i) {
    if (key[i] < '0' || key[i] > '9') return -1;
  }
  return std::stoll(key.substr(6, dot - 6));
}

namespace {

// "param.<i>.rest" (or "param.<i>") with i replaced by `index`.
std::string with_index(const std::string& key, long long index) {
  const auto dot = key.find('.', 6);
  return "param." + std::to_string(index) + (dot == std::string::npos ? std::string() : key.substr(dot));
}

// The index of "param.<i>" alone (a ranges or layouts key), or -1.
long long bare_param_index(const std::string& key) { return optimizer_param_index(key + "."); }

}  // namespace

std::vector<std::string> key_parts_by_name(std::vector<OptimizerPart>& parts) {
  std::set<std::string> all;
  for (const auto& part : parts) {
    if (part.names.empty()) return {};  // an older checkpoint: indices as saved
    for (const auto& [key, name] : part.names) all.insert(name);
  }
  const std::vector<std::string> names(all.begin(), all.end());
  std::map<std::string, long long> index_of;
  for (std::size_t i = 0; i < names.size(); ++i) index_of[names[i]] = static_cast<long long>(i);
  for (auto& part : parts) {
    auto renumber = [&](const std::string& key, long long local) -> std::string {
      const auto name = part.names.find("param." + std::to_string(local));
      if (name == part.names.end()) throw CheckpointError("optimizer state " + key + " has no saved parameter name");
      return with_index(key, index_of.at(name->second));
    };
    StateDict state, ranges, layouts;
    for (auto& [key, t] : part.state) {
      const long long local = optimizer_param_index(key);
      state[local < 0 ? key : renumber(key, local)] = t;
    }
    for (auto& [key, t] : part.ranges) ranges[renumber(key, bare_param_index(key))] = t;
    for (auto& [key, t] : part.layouts) layouts[renumber(key, bare_param_index(key))] = t;
    part.state = std::move(state);
    part.ranges = std::move(ranges);
    part.layouts = std::move(layouts);
  }
  return names;
}

StateDict optimizer_state_by_index(const StateDict& by_name_index, const std::vector<std::string>& names,
                                   const std::vector<std::string>& params_names) {
  std::map<std::string, long long> local_of;
  for (std::size_t i = 0; i < params_names.size(); ++i) local_of[params_names[i]] = static_cast<long long>(i);
  StateDict out;
  for (const auto& [key, t] : by_name_index) {
    const long long index = optimizer_param_index(key);
    if (index < 0) {
      out[key] = t;
      continue;
    }
    if (index >= static_cast<long long>(names.size())) throw CheckpointError("optimizer state " + key + " has no name");
    const auto local = local_of.find(names[static_cast<std::size_t>(index)]);
    if (local == local_of.end()) continue;  // another pipeline stage's parameter
    out[with_index(key, local->second)] = t;
  }
  const std::set<std::string> saved(names.begin(), names.end());
  for (const auto& name : params_names) {
    if (!saved.count(name)) throw CheckpointError("the checkpoint has no optimizer state for parameter " + name);
  }
  return out;
}

StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges) {
  StateDict whole;
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> covered;
  for (const auto& [state, ranges] : parts_and_ranges) {
    for (const auto& [key, t] : state) {
      const long long index = optimizer_param_index(key);
      if (index < 0 || t.dim() == 0) {
        if (!whole.count(key)) whole[key] = t;  // the same on every rank
        continue;
      }
      const auto range = ranges.find("param." + std::to_string(index));
      if (range == ranges.end() || range->second.numel() != 3) {
        throw CheckpointError("optimizer state " + key + " has no saved range");
      }
      const auto begin = range->second[0].item<std::int64_t>(), end = range->second[1].item<std::int64_t>(),
                 numel = range->second[2].item<std::int64_t>();
      if (begin < 0 || end < begin || end > numel || t.numel() != end - begin) {
        throw CheckpointError("optimizer state " + key + " has " + std::to_string(t.numel()) +
                              " elements for the range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
      }
      at::Tensor& target = whole[key];
      covered[key].emplace_back(begin, end);
      if (!target.defined() && begin == 0 && end == numel) {
        target = t.reshape({-1});  // one part holds it all (an unsharded save): no copy
        continue;
      }
      if (!target.defined()) target = at::zeros({numel}, t.options());
      if (target.numel() != numel) {
        throw CheckpointError("optimizer state " + key + ": ranks disagree on the parameter's size (" +
                              std::to_string(target.numel()) + " and " + std::to_string(numel) + ")");
      }
      target.narrow(0, begin, end - begin).copy_(t.reshape({-1}));
    }
  }
  // The parts of each parameter must tile it exactly: no hole silently zero, no overlap.
  for (auto& [key, ranges] : covered) {
    std::sort(ranges.begin(), ranges.end());
    std::int64_t next = 0;
    for (const auto& [begin, end] : ranges) {
      if (begin != next) {
        throw CheckpointError("optimizer state " + key + ": the saved parts leave a hole or overlap at element " +
                              std::to_string(next));
      }
      next = end;
    }
    if (next != whole.at(key).numel()) {
      throw CheckpointError("optimizer state " + key + ": the saved parts cover " + std::to_string(next) + " of " +
                            std::to_string(whole.at(key).numel()) + " elements");
    }
  }
  return whole;
}

StateDict optimizer_state_for(const StateDict& whole, const std::vector<at::Tensor>& params,
                              const std::vector<std::pair<std::int64_t, std::int64_t>>* ranges) {
  StateDict out;
  for (const auto& [key, t] : whole) {
    const long long index = optimizer_param_index(key);
    if (index < 0 || t.dim() == 0) {
      out[key] = t.clone();
      continue;
    }
    if (index >= static_cast<long long>(params.size())) {
      throw CheckpointError("optimizer state " + key + " names parameter " + std::to_string(index) + " but the optimizer has " +
                            std::to_string(params.size()) + "; was the model changed?");
    }
    const at::Tensor& p = params[static_cast<std::size_t>(index)];
    if (t.numel() != p.numel()) {
      throw CheckpointError("optimizer state " + key + " has " + std::to_string(t.numel()) + " elements, parameter " +
                            std::to_string(index) + " has " + std::to_string(p.numel()) + "; was the model changed?");
    }
    if (ranges) {
      const auto [begin, end] = (*ranges)[static_cast<std::size_t>(index)];
      out[key] = t.reshape({-1}).narrow(0, begin, end - begin).clone();
    } else {
      out[key] = t.reshape(p.sizes()).clone();
    }
  }
  return out;
}

at::Tensor shard_layout(ShardRanks ranks, const TensorShard& shard, at::IntArrayRef local_shape) {
  // A padded split (one block) records its true size as a negative block count.
  std::vector<std::int64_t> values = {ranks.rank, ranks.size, shard.dim, shard.padded() ? -shard.whole : shard.blocks};
  values.insert(values.end(), local_shape.begin(), local_shape.end());
  return at::tensor(values, at::kLong);
}

StateDict merge_optimizer_files(const std::vector<OptimizerPart>& parts) {
  // Which keys are there: per-parameter ones are merged parameter by parameter, the others (the
  // same on every rank) taken from the first part that has them.
  std::map<std::string, bool> keys;
  for (const auto& part : parts) {
    for (const auto& [key, t] : part.state) keys[key] = optimizer_param_index(key) >= 0 && t.dim() > 0;
  }
  StateDict whole;
  for (const auto& [key, per_element] : keys) {
    if (!per_element) {
      for (const auto& part : parts) {
        const auto it = part.state.find(key);
        if (it != part.state.end()) {
          whole[key] = it->second;
          break;
        }
      }
      continue;
    }
    const std::string param = "param." + std::to_string(optimizer_param_index(key));
    // The parts of each rank of the parameter's layout.
    std::map<std::int64_t, std::vector<std::pair<StateDict, StateDict>>> by_rank;
    at::Tensor layout;
    std::size_t with_layout = 0, holding = 0;
    for (const auto& part : parts) {
      const auto it = part.state.find(key);
      if (it == part.state.end()) continue;
      ++holding;
      const auto range = part.ranges.find(param);
      const auto found = part.layouts.find(param);
      const std::int64_t rank = found != part.layouts.end() ? found->second[0].item<std::int64_t>() : 0;
      if (found != part.layouts.end()) {
        if (found->second.numel() < 4) throw CheckpointError("optimizer layout of " + param + " is malformed");
        if (layout.defined() && found->second[1].item<std::int64_t>() != layout[1].item<std::int64_t>()) {
          throw CheckpointError("optimizer state " + key + " was saved in parts of different splits (" +
                                std::to_string(layout[1].item<std::int64_t>()) + " and " +
                                std::to_string(found->second[1].item<std::int64_t>()) + " ranks)");
        }
        layout = found->second;
        ++with_layout;
      }
      StateDict ranges;
      if (range != part.ranges.end()) ranges[param] = range->second;
      by_rank[rank].push_back({StateDict{{key, it->second}}, std::move(ranges)});
    }
    if (with_layout != 0 && with_layout != holding) {
      throw CheckpointError("optimizer state " + key + " has a saved layout in " + std::to_string(with_layout) + " of the " +
                            std::to_string(holding) + " parts holding it");
    }
    const std::int64_t size = layout.defined() ? layout[1].item<std::int64_t>() : 1;
    if (static_cast<std::int64_t>(by_rank.size()) != size) {
      throw CheckpointError("optimizer state " + key + " was saved in " + std::to_string(size) + " parts, " +
                            std::to_string(by_rank.size()) + " were found");
    }
    const bool padded = layout.defined() && layout[3].item<std::int64_t>() < 0;
    if (size == 1 && !padded) {
      whole[key] = merge_optimizer_parts(by_rank.begin()->second).at(key);
      continue;
    }
    TensorShard shard{layout[2].item<std::int64_t>(), padded ? 1 : layout[3].item<std::int64_t>()};
    if (padded) shard.whole = -layout[3].item<std::int64_t>();  // the parts' padding is dropped
    std::vector<std::int64_t> shape;
    for (std::int64_t d = 4; d < layout.numel(); ++d) shape.push_back(layout[d].item<std::int64_t>());
    std::vector<at::Tensor> pieces;
    for (const auto& [rank, rank_parts] : by_rank) pieces.push_back(merge_optimizer_parts(rank_parts).at(key).reshape(shape));
    whole[key] = TensorParallel::join(pieces, shard).reshape({-1});
  }
  return whole;
}

StateDict shard_part(const StateDict& whole, const std::vector<Placement>& placements) {
  StateDict out;
  for (const auto& [key, t] : whole) {
    const long long index = optimizer_param_index(key);
    if (index < 0 || t.dim() == 0 || index >= static_cast<long long>(placements.size())) {
      out[key] = t;
      continue;
    }
    const Placement& p = placements[static_cast<std::size_t>(index)];
    if (!p.cut()) {
      out[key] = t;
      continue;
    }
    if (t.numel() != p.whole_numel()) {
      throw CheckpointError("optimizer state " + key + " has " + std::to_string(t.numel()) + " elements, parameter " +
                            std::to_string(index) + " has " + std::to_string(p.whole_numel()) +
                            " in all; was the model changed?");
    }
    out[key] = part_of(t.reshape(p.whole_shape), p.shard, p.part).reshape({-1});
  }
  return out;
}

}  // namespace tessera::core
