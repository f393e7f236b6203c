// Saved shares (tessera/parallel/saved_shares.hpp): a tensor whole again from the pieces every
// rank of one mesh saved, and cut for another.
#include "tessera/parallel/saved_shares.hpp"

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "tessera/error.hpp"

namespace tessera {

at::Tensor layout_of(const Placement& p, at::IntArrayRef local_shape) {
  std::vector<std::int64_t> values = {p.part.rank, p.part.size, p.shard.dim,
                                      p.shard.padded() ? -p.shard.whole : p.shard.blocks};
  values.insert(values.end(), local_shape.begin(), local_shape.end());
  return at::tensor(values, at::kLong);
}

namespace {

// One part's local tensor, flattened, from its shares: they must tile its elements exactly.
at::Tensor join_part(std::vector<const SavedShare*> shares) {
  std::sort(shares.begin(), shares.end(), [](const SavedShare* a, const SavedShare* b) {
    return std::make_pair(a->begin, a->end) < std::make_pair(b->begin, b->end);
  });
  const std::int64_t numel = shares.front()->local_numel;
  at::Tensor flat;
  std::int64_t next = 0;
  for (const SavedShare* s : shares) {
    if (s->local_numel != numel) {
      throw Error("has parts that disagree on its size (" + std::to_string(numel) + " and " +
                  std::to_string(s->local_numel) + ")");
    }
    if (s->begin < 0 || s->end < s->begin || s->end > numel || s->values.numel() != s->end - s->begin) {
      throw Error("has " + std::to_string(s->values.numel()) + " elements for the range [" +
                  std::to_string(s->begin) + ", " + std::to_string(s->end) + ")");
    }
    // A rank whose share holds none of it saved an empty range: at 0 (as strategies report one)
    // or where it lies among the others.
    if (s->end == s->begin && (s->begin == 0 || s->begin == next)) continue;
    if (s->begin != next) {
      throw Error("has saved parts that leave a hole or overlap at element " + std::to_string(next));
    }
    if (s->begin == 0 && s->end == numel) {
      flat = s->values.reshape({-1});  // one piece holds it all (an unsharded save): no copy
    } else {
      if (!flat.defined()) flat = at::zeros({numel}, s->values.options());
      flat.narrow(0, s->begin, s->end - s->begin).copy_(s->values.reshape({-1}));
    }
    next = s->end;
  }
  if (!flat.defined()) flat = at::zeros({numel}, shares.front()->values.options());  // no elements
  if (next != numel) {
    throw Error("has saved parts that cover " + std::to_string(next) + " of " + std::to_string(numel) + " elements");
  }
  return flat;
}

}  // namespace

at::Tensor join_saved_shares(const std::vector<SavedShare>& shares) {
  if (shares.empty()) throw Error("has no saved part");
  // The pieces of each part (the rank of the layout's split).
  std::map<std::int64_t, std::vector<const SavedShare*>> by_part;
  const at::Tensor* layout = nullptr;
  std::size_t with_layout = 0;
  for (const SavedShare& s : shares) {
    std::int64_t part = 0;
    if (s.layout.defined()) {
      if (s.layout.numel() < 4) throw Error("has a malformed saved layout");
      if (layout && s.layout[1].item<std::int64_t>() != (*layout)[1].item<std::int64_t>()) {
        throw Error("was saved in parts of different splits (" + std::to_string((*layout)[1].item<std::int64_t>()) +
                    " and " + std::to_string(s.layout[1].item<std::int64_t>()) + " ranks)");
      }
      layout = &s.layout;
      part = s.layout[0].item<std::int64_t>();
      ++with_layout;
    }
    by_part[part].push_back(&s);
  }
  if (with_layout != 0 && with_layout != shares.size()) {
    throw Error("has a saved layout in " + std::to_string(with_layout) + " of the " +
                std::to_string(shares.size()) + " parts holding it");
  }
  const std::int64_t parts = layout ? (*layout)[1].item<std::int64_t>() : 1;
  if (static_cast<std::int64_t>(by_part.size()) != parts) {
    throw Error("was saved in " + std::to_string(parts) + " parts, " + std::to_string(by_part.size()) +
                " were found");
  }
  const bool padded = layout && (*layout)[3].item<std::int64_t>() < 0;
  if (parts == 1 && !padded) return join_part(by_part.begin()->second);
  TensorShard shard{(*layout)[2].item<std::int64_t>(), padded ? 1 : (*layout)[3].item<std::int64_t>()};
  if (padded) shard.whole = -(*layout)[3].item<std::int64_t>();  // the parts' padding is dropped
  std::vector<std::int64_t> shape;
  for (std::int64_t d = 4; d < layout->numel(); ++d) shape.push_back((*layout)[d].item<std::int64_t>());
  std::vector<at::Tensor> pieces;
  for (const auto& [part, part_shares] : by_part) pieces.push_back(join_part(part_shares).reshape(shape));
  return TensorParallel::join(pieces, shard).reshape({-1});
}

at::Tensor part_of_whole(const at::Tensor& whole, const Placement& p) {
  if (!p.cut()) return whole.reshape({-1});
  if (whole.numel() != p.whole_numel()) {
    throw Error("a whole of " + std::to_string(whole.numel()) + " elements for a tensor of " +
                std::to_string(p.whole_numel()));
  }
  return part_of(whole.reshape(p.whole_shape), p.shard, p.part).reshape({-1});
}

}  // namespace tessera
