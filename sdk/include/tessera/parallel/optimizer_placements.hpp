// Where each of an optimizer's parameters lives on this rank, and the collectives that make one
// whole: what an optimizer that transforms whole matrices (Muon's orthogonalisation, a layer-wise
// trust ratio) needs under every mesh without knowing its axes.
//
// A parameter is cut in two ways at once. The model's axes (tensor and expert parallelism) give
// each rank a part of the whole: its local tensor (Placement: the split, the part). The data-
// parallel strategy's sharding of optimizer state (zero1, zero2, fsdp) gives each rank a share of
// that local tensor: the elements [state.begin, state.end) of the flattened local tensor, the
// shares of its share group's ranks laid end to end in their rank order, some of them empty
// (ParallelStrategy::state_share_groups). During Optimizer::step() a sharding strategy points parameter i at this
// rank's share (1-D); otherwise the share is the local tensor itself.
//
// The trainer builds one after the strategy's setup and hands it to the optimizer
// (Optimizer::set_placements). The gathers are collectives: every rank of the share group (and,
// for whole(), of the parameter's model axis) calls them for the same parameter in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/parallel/placement.hpp"

namespace tessera {

class Communicator;

class TESSERA_API OptimizerPlacements {
 public:
  // One parameter as the trainer found it after the strategy's setup.
  struct Parameter {
    std::string name;                       // the model's name ("" for a tensor it does not name)
    std::vector<std::int64_t> local_shape;  // this rank's part along the model's axes
    Placement placement;                    // its state share filled from the strategy
    // The ranks whose shares tile it (null, or a group of one: not shared). The strategy's group,
    // valid while the run's trainer lives: an optimizer keeps these placements no longer.
    Communicator* share_group = nullptr;
  };

  // The parameters of Optimizer::parameters() in order. Exchanges every rank's state shares over
  // each distinct share group once (a collective of those groups, every rank in one order).
  OptimizerPlacements(Placements model, std::vector<Parameter> parameters);

  std::size_t size() const { return parameters_.size(); }
  const Parameter& operator[](std::size_t i) const { return parameters_.at(i); }
  const Placements& model() const { return model_; }
  // Parameter i is cut at all: shared over ranks, or split over a model axis (or padded).
  bool cut(std::size_t i) const;

  // Parameter i's local tensor (its part along the model's axes, in its local shape) from this
  // rank's share: the shares of its share group all-gathered and laid end to end. The share
  // itself, reshaped (a view of it), where nothing is shared: like whole(), the result may alias
  // the parameter, so an optimizer transforms a copy. A collective of the share group.
  at::Tensor local(std::size_t i, const at::Tensor& share) const;

  // Whole-matrix work split over the share groups instead of repeated on every rank of one
  // (Moonlight's distributed Muon). owners(): the rank of its share group that works on each of
  // `indices`, the largest local tensor first to the least loaded rank (by elements), the same on
  // every rank; -1 where a parameter is not shared (each rank works on its own).
  std::vector<std::int64_t> owners(const std::vector<std::size_t>& indices) const;
  // The local tensors of the parameters this rank owns, every rank's shares sent to the owner in
  // one all-to-all per share group; undefined for the parameters others own, the share reshaped
  // where a parameter is not shared. A collective of the share groups, as local()'s batch.
  std::vector<at::Tensor> local_at_owners(const std::vector<std::size_t>& indices,
                                          const std::vector<at::Tensor>& shares) const;
  // The way back: `owned[k]`, parameter indices[k]'s local tensor where this rank owns it (or
  // where it is not shared), cut into the shares of its group's ranks and sent in one all-to-all
  // per share group; where another rank owns it, any tensor of the results' dtype and device
  // (only those are read). Returns this rank's share of each (share_of_local's).
  std::vector<at::Tensor> shares_from_owners(const std::vector<std::size_t>& indices,
                                             const std::vector<at::Tensor>& owned) const;
  // Parameter i's whole tensor from this rank's share: local(), then gathered over its model axis
  // (Placements::whole). Stacked experts come whole over the expert-parallel ranks too; an
  // optimizer treating experts one by one takes local() instead. A collective of the share group
  // and then of the axis' ranks.
  at::Tensor whole(std::size_t i, const at::Tensor& share) const;
  // This rank's share of parameter i's local tensor (1-D where the strategy shares it).
  at::Tensor share_of_local(std::size_t i, const at::Tensor& local) const;
  // This rank's share of parameter i's whole tensor: cut by its model placement, then shared.
  at::Tensor share_of_whole(std::size_t i, const at::Tensor& whole) const;

 private:
  Placements model_;
  std::vector<Parameter> parameters_;
  // The positions k of `indices` whose parameters are shared, by share group in the order each
  // group first comes.
  std::vector<std::pair<Communicator*, std::vector<std::size_t>>> by_share_group(
      const std::vector<std::size_t>& indices) const;
  std::int64_t local_numel(std::size_t i) const;
  // Per parameter, every rank's [begin, end) in its share group's rank order (empty: not shared).
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> shares_;
};

}  // namespace tessera
