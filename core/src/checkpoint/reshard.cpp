#include "tessera/core/checkpoint/reshard.hpp"

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "tessera/core/checkpoint/checkpoint_state.hpp"
#include "tessera/parallel/saved_shares.hpp"

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

namespace {

// A key's pieces whole again (join_saved_shares), its errors naming the key.
at::Tensor join_key(const std::string& key, const std::vector<SavedShare>& shares) {
  try {
    return join_saved_shares(shares);
  } catch (const Error& e) {
    throw CheckpointError("optimizer state " + key + " " + e.what());
  }
}

// The piece of `key` (per-element state of parameter `param`) that a part saved.
SavedShare saved_share(const std::string& key, const std::string& param, const at::Tensor& values,
                       const StateDict& ranges, const StateDict* layouts) {
  const auto range = ranges.find(param);
  if (range == ranges.end() || range->second.numel() != 3) {
    throw CheckpointError("optimizer state " + key + " has no saved range");
  }
  SavedShare s;
  s.begin = range->second[0].item<std::int64_t>();
  s.end = range->second[1].item<std::int64_t>();
  s.local_numel = range->second[2].item<std::int64_t>();
  s.values = values;
  if (layouts) {
    const auto layout = layouts->find(param);
    if (layout != layouts->end()) s.layout = layout->second;
  }
  return s;
}

}  // namespace

StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges) {
  StateDict whole;
  std::map<std::string, std::vector<SavedShare>> pieces;
  for (const auto& [state, ranges] : parts_and_ranges) {
    for (const auto& [key, t] : state) {
      const long long index = optimizer_param_index(key);
      if (index < 0 || t.dim() == 0) {
        if (!whole.count(key)) whole[key] = t;  // the same on every rank
        continue;
      }
      pieces[key].push_back(saved_share(key, "param." + std::to_string(index), t, ranges, nullptr));
    }
  }
  for (const auto& [key, shares] : pieces) whole[key] = join_key(key, shares);
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

StateDict merge_optimizer_files(const std::vector<OptimizerPart>& parts) {
  // Per-parameter keys are joined from every part's piece and layout (tessera/parallel/
  // saved_shares.hpp); the others (the same on every rank) taken from the first part with them.
  StateDict whole;
  std::map<std::string, std::vector<SavedShare>> pieces;
  for (const auto& part : parts) {
    for (const auto& [key, t] : part.state) {
      const long long index = optimizer_param_index(key);
      if (index < 0 || t.dim() == 0) {
        if (!whole.count(key)) whole[key] = t;
        continue;
      }
      pieces[key].push_back(saved_share(key, "param." + std::to_string(index), t, part.ranges, &part.layouts));
    }
  }
  for (const auto& [key, shares] : pieces) whole[key] = join_key(key, shares);
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
    if (p.cut() && t.numel() != p.whole_numel()) {
      throw CheckpointError("optimizer state " + key + " has " + std::to_string(t.numel()) + " elements, parameter " +
                            std::to_string(index) + " has " + std::to_string(p.whole_numel()) +
                            " in all; was the model changed?");
    }
    out[key] = p.cut() ? part_of_whole(t, p) : t;
  }
  return out;
}

}  // namespace tessera::core
