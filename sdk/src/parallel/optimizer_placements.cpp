// OptimizerPlacements (tessera/parallel/optimizer_placements.hpp): an optimizer's parameters made
// whole from this rank's share, and cut back to it.
#include "tessera/parallel/optimizer_placements.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>

#include "tessera/error.hpp"
#include "tessera/run/communicator.hpp"

namespace tessera {

namespace {

// One all-to-all of `group`: to rank r the pieces `to[r]` laid end to end; from rank r `from[r]`
// elements.
std::vector<at::Tensor> exchange(Communicator& group, const std::vector<std::vector<at::Tensor>>& to,
                                 const std::vector<std::int64_t>& from, const at::TensorOptions& options) {
  std::vector<at::Tensor> inputs, outputs;
  for (std::size_t r = 0; r < to.size(); ++r) {
    inputs.push_back(to[r].empty() ? at::empty({0}, options) : at::cat(to[r]));
    outputs.push_back(at::empty({from[r]}, options));
  }
  group.all_to_all(outputs, inputs);
  return outputs;
}

}  // namespace

OptimizerPlacements::OptimizerPlacements(Placements model, std::vector<Parameter> parameters)
    : model_(std::move(model)), parameters_(std::move(parameters)), shares_(parameters_.size()) {
  // The distinct share groups in order of first use: the same order on every rank of a group,
  // whose members hold the same parameters.
  std::vector<Communicator*> groups;
  for (const Parameter& p : parameters_) {
    if (p.share_group && p.share_group->world_size() > 1 &&
        std::find(groups.begin(), groups.end(), p.share_group) == groups.end()) {
      groups.push_back(p.share_group);
    }
  }
  // Every exchange first, then the checks: a rank that found a fault must not leave its peers
  // of another group waiting in that group's exchange.
  std::vector<std::pair<std::vector<std::size_t>, std::vector<at::Tensor>>> exchanged;
  for (Communicator* group : groups) {
    std::vector<std::int64_t> mine;
    std::vector<std::size_t> members;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (parameters_[i].share_group != group) continue;
      members.push_back(i);
      mine.push_back(parameters_[i].placement.state.begin);
      mine.push_back(parameters_[i].placement.state.end);
    }
    const at::Tensor sent = at::tensor(mine, at::kLong);
    std::vector<at::Tensor> got;
    for (std::int64_t r = 0; r < group->world_size(); ++r) got.push_back(at::empty_like(sent));
    group->all_gather_async(got, sent)->wait();
    exchanged.emplace_back(std::move(members), std::move(got));
  }
  for (const auto& [members, got] : exchanged) {
    for (std::size_t k = 0; k < members.size(); ++k) {
      const std::size_t i = members[k];
      std::int64_t next = 0;
      for (const at::Tensor& rank : got) {
        const auto* range = rank.data_ptr<std::int64_t>() + 2 * k;
        if (range[1] == range[0]) {  // a rank whose share holds none of it (any begin)
          shares_[i].emplace_back(next, next);
          continue;
        }
        if (range[0] != next || range[1] < range[0]) {
          throw Error("optimizer placements: the state shares of " + parameters_[i].name +
                      " do not tile it in the share group's rank order (the strategy's owned_ranges)");
        }
        shares_[i].emplace_back(range[0], range[1]);
        next = range[1];
      }
      std::int64_t numel = 1;
      for (const std::int64_t d : parameters_[i].local_shape) numel *= d;
      if (next != numel) {
        throw Error("optimizer placements: the state shares of " + parameters_[i].name + " cover " +
                    std::to_string(next) + " of its " + std::to_string(numel) + " elements");
      }
    }
  }
}

bool OptimizerPlacements::cut(std::size_t i) const {
  return !shares_.at(i).empty() || parameters_.at(i).placement.cut();
}

at::Tensor OptimizerPlacements::local(std::size_t i, const at::Tensor& share) const {
  const Parameter& p = parameters_.at(i);
  const auto& shares = shares_.at(i);
  if (shares.empty()) return share.reshape(p.local_shape);
  // Every rank's share padded to the longest, gathered, and laid end to end without the padding.
  std::int64_t longest = 0;
  for (const auto& [begin, end] : shares) longest = std::max(longest, end - begin);
  const at::Tensor flat = share.reshape({-1});
  at::Tensor padded = flat;
  if (flat.numel() != longest) {
    padded = at::zeros({longest}, flat.options());
    padded.narrow(0, 0, flat.numel()).copy_(flat);
  }
  std::vector<at::Tensor> got;
  for (std::size_t r = 0; r < shares.size(); ++r) got.push_back(at::empty({longest}, flat.options()));
  p.share_group->all_gather_async(got, padded.contiguous())->wait();
  std::vector<at::Tensor> laid;
  for (std::size_t r = 0; r < shares.size(); ++r) laid.push_back(got[r].narrow(0, 0, shares[r].second - shares[r].first));
  return at::cat(laid).reshape(p.local_shape);
}

std::vector<std::pair<Communicator*, std::vector<std::size_t>>> OptimizerPlacements::by_share_group(
    const std::vector<std::size_t>& indices) const {
  std::vector<std::pair<Communicator*, std::vector<std::size_t>>> groups;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    if (shares_.at(indices[k]).empty()) continue;
    Communicator* group = parameters_[indices[k]].share_group;
    auto found = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == group; });
    if (found == groups.end()) found = groups.insert(groups.end(), {group, {}});
    found->second.push_back(k);
  }
  return groups;
}

std::int64_t OptimizerPlacements::local_numel(std::size_t i) const {
  std::int64_t n = 1;
  for (const std::int64_t d : parameters_.at(i).local_shape) n *= d;
  return n;
}

std::vector<std::int64_t> OptimizerPlacements::owners(const std::vector<std::size_t>& indices) const {
  std::vector<std::int64_t> owner(indices.size(), -1);
  for (const auto& [group, members] : by_share_group(indices)) {
    // Largest first (ties in order), each to the rank with the fewest elements so far (ties: the lowest).
    std::vector<std::size_t> order = members;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return local_numel(indices[a]) > local_numel(indices[b]);
    });
    std::vector<std::int64_t> load(static_cast<std::size_t>(group->world_size()), 0);
    for (std::size_t k : order) {
      const auto least = std::min_element(load.begin(), load.end()) - load.begin();
      owner[k] = least;
      load[static_cast<std::size_t>(least)] += local_numel(indices[k]);
    }
  }
  return owner;
}

std::vector<at::Tensor> OptimizerPlacements::local_at_owners(const std::vector<std::size_t>& indices,
                                                             const std::vector<at::Tensor>& shares) const {
  if (indices.size() != shares.size()) throw Error("optimizer placements: local_at_owners takes one share per index");
  std::vector<at::Tensor> out(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    if (shares_.at(indices[k]).empty()) out[k] = shares[k].reshape(parameters_[indices[k]].local_shape);
  }
  const std::vector<std::int64_t> owner = owners(indices);
  for (const auto& [group, members] : by_share_group(indices)) {
    const auto ranks = static_cast<std::size_t>(group->world_size());
    const std::int64_t me = group->rank();
    const at::TensorOptions options = shares[members.front()].options();
    // To rank r: this rank's shares of what r owns; from rank r: its shares of what this rank owns.
    std::vector<std::vector<at::Tensor>> to(ranks);
    std::vector<std::int64_t> from(ranks, 0);
    for (std::size_t k : members) {
      to[static_cast<std::size_t>(owner[k])].push_back(shares[k].reshape({-1}));
      if (owner[k] != me) continue;
      for (std::size_t r = 0; r < ranks; ++r) from[r] += shares_[indices[k]][r].second - shares_[indices[k]][r].first;
    }
    const std::vector<at::Tensor> outputs = exchange(*group, to, from, options);
    std::vector<std::int64_t> offsets(ranks, 0);
    for (std::size_t k : members) {
      if (owner[k] != me) continue;
      const auto& ranges = shares_[indices[k]];
      std::vector<at::Tensor> laid;
      for (std::size_t r = 0; r < ranks; ++r) {
        const std::int64_t length = ranges[r].second - ranges[r].first;
        laid.push_back(outputs[r].narrow(0, offsets[r], length));
        offsets[r] += length;
      }
      out[k] = at::cat(laid).reshape(parameters_[indices[k]].local_shape);
    }
  }
  return out;
}

std::vector<at::Tensor> OptimizerPlacements::shares_from_owners(const std::vector<std::size_t>& indices,
                                                                const std::vector<at::Tensor>& owned) const {
  if (indices.size() != owned.size()) throw Error("optimizer placements: shares_from_owners takes one tensor per index");
  std::vector<at::Tensor> out(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    if (shares_.at(indices[k]).empty()) out[k] = share_of_local(indices[k], owned[k]);
  }
  const std::vector<std::int64_t> owner = owners(indices);
  for (const auto& [group, members] : by_share_group(indices)) {
    const auto ranks = static_cast<std::size_t>(group->world_size());
    const std::int64_t me = group->rank();
    const at::TensorOptions options = owned[members.front()].options();
    // To rank r: its share of each parameter this rank owns; from the owners: this rank's shares.
    std::vector<std::vector<at::Tensor>> to(ranks);
    std::vector<std::int64_t> from(ranks, 0);
    for (std::size_t k : members) {
      const auto& ranges = shares_[indices[k]];
      const auto mine = static_cast<std::size_t>(me);
      from[static_cast<std::size_t>(owner[k])] += ranges[mine].second - ranges[mine].first;
      if (owner[k] != me) continue;
      const at::Tensor flat = owned[k].reshape({-1});
      for (std::size_t r = 0; r < ranks; ++r) {
        to[r].push_back(flat.narrow(0, ranges[r].first, ranges[r].second - ranges[r].first));
      }
    }
    const std::vector<at::Tensor> outputs = exchange(*group, to, from, options);
    std::vector<std::int64_t> offsets(ranks, 0);
    for (std::size_t k : members) {
      const auto source = static_cast<std::size_t>(owner[k]);
      const auto& range = shares_[indices[k]][static_cast<std::size_t>(me)];
      out[k] = outputs[source].narrow(0, offsets[source], range.second - range.first);
      offsets[source] += range.second - range.first;
    }
  }
  return out;
}

at::Tensor OptimizerPlacements::whole(std::size_t i, const at::Tensor& share) const {
  return model_.whole(parameters_.at(i).name, local(i, share));
}

at::Tensor OptimizerPlacements::share_of_local(std::size_t i, const at::Tensor& local) const {
  const Placement::StateShare& mine = parameters_.at(i).placement.state;
  // A sharding strategy's share is 1-D even where its group is this rank alone.
  if (!mine.sharded) return local;
  return local.reshape({-1}).narrow(0, mine.begin, mine.end - mine.begin);
}

at::Tensor OptimizerPlacements::share_of_whole(std::size_t i, const at::Tensor& whole) const {
  const std::string& name = parameters_.at(i).name;
  return share_of_local(i, model_.cut({{name, whole}}).at(name));
}

}  // namespace tessera
