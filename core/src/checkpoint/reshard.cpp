#include "tessera/core/checkpoint/reshard.hpp"

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <string>

#include "tessera/core/checkpoint/checkpoint_state.hpp"

namespace tessera::core {
namespace {

// The index i of a per-parameter key "param.<i>.<field>", or -1.
long long param_index(const std::string& key) {
  if (key.rfind("param.", 0) != 0) return -1;
  const auto dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6) return -1;
  for (std::size_t i = 6; i < dot; ++i) {
    if (key[i] < '0' || key[i] > '9') return -1;
  }
  return std::stoll(key.substr(6, dot - 6));
}

}  // namespace

StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges) {
  StateDict whole;
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> covered;
  for (const auto& [state, ranges] : parts_and_ranges) {
    for (const auto& [key, t] : state) {
      const long long index = param_index(key);
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
    const long long index = param_index(key);
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

at::Tensor tensor_parallel_layout(const TensorParallel& tp, const TensorShard& shard, at::IntArrayRef local_shape) {
  std::vector<std::int64_t> values = {tp.rank(), tp.size(), shard.dim, shard.blocks};
  values.insert(values.end(), local_shape.begin(), local_shape.end());
  return at::tensor(values, at::kLong);
}

StateDict merge_optimizer_files(const std::vector<OptimizerPart>& parts) {
  // Parts by tensor-parallel rank; each layout of a part names the same rank and size.
  std::map<std::int64_t, std::vector<std::pair<StateDict, StateDict>>> by_rank;
  std::map<std::int64_t, StateDict> layouts;  // tp rank -> its parameters' layouts
  std::int64_t tp_size = 1;
  for (const auto& part : parts) {
    std::int64_t rank = 0;
    for (const auto& [key, layout] : part.layouts) {
      if (layout.numel() < 4) throw CheckpointError("optimizer layout " + key + " is malformed");
      rank = layout[0].item<std::int64_t>();
      tp_size = layout[1].item<std::int64_t>();
      layouts[rank][key] = layout;
    }
    by_rank[rank].emplace_back(part.state, part.ranges);
  }
  if (static_cast<std::int64_t>(by_rank.size()) != tp_size) {
    throw CheckpointError("the optimizer state was saved by " + std::to_string(tp_size) +
                          " tensor-parallel ranks, but parts of " + std::to_string(by_rank.size()) + " were found");
  }
  std::vector<StateDict> merged;
  for (const auto& [rank, rank_parts] : by_rank) merged.push_back(merge_optimizer_parts(rank_parts));
  if (tp_size == 1) return merged.front();
  StateDict whole;
  for (const auto& [key, t] : merged.front()) {
    const long long index = param_index(key);
    if (index < 0 || t.dim() == 0) {
      whole[key] = t;
      continue;
    }
    const std::string param = "param." + std::to_string(index);
    const at::Tensor layout = layouts[0].count(param) ? layouts[0].at(param) : at::Tensor();
    if (!layout.defined()) throw CheckpointError("optimizer state " + key + " has no saved layout");
    const TensorShard shard{layout[2].item<std::int64_t>(), layout[3].item<std::int64_t>()};
    std::vector<std::int64_t> shape;
    for (std::int64_t d = 4; d < layout.numel(); ++d) shape.push_back(layout[d].item<std::int64_t>());
    std::vector<at::Tensor> pieces;
    for (std::int64_t r = 0; r < tp_size; ++r) {
      const auto found = merged[static_cast<std::size_t>(r)].find(key);
      if (found == merged[static_cast<std::size_t>(r)].end()) {
        throw CheckpointError("optimizer state " + key + " is missing from tensor-parallel rank " + std::to_string(r));
      }
      pieces.push_back(found->second.reshape(shape));
    }
    whole[key] = TensorParallel::join(pieces, shard).reshape({-1});
  }
  return whole;
}

StateDict tensor_parallel_part(const StateDict& whole, const std::vector<at::Tensor>& params,
                               const std::vector<TensorShard>& shards, const TensorParallel& tp) {
  if (tp.size() == 1) return whole;
  StateDict out;
  for (const auto& [key, t] : whole) {
    const long long index = param_index(key);
    if (index < 0 || t.dim() == 0 || index >= static_cast<long long>(params.size())) {
      out[key] = t;
      continue;
    }
    const auto i = static_cast<std::size_t>(index);
    const auto shape = tp.whole_shape(params[i].sizes(), shards[i]);
    std::int64_t numel = 1;
    for (auto d : shape) numel *= d;
    if (t.numel() != numel) {
      throw CheckpointError("optimizer state " + key + " has " + std::to_string(t.numel()) + " elements, parameter " +
                            std::to_string(index) + " has " + std::to_string(numel) + " in all; was the model changed?");
    }
    out[key] = tp.part_of(t.reshape(shape), shards[i]).reshape({-1});
  }
  return out;
}

}  // namespace tessera::core
