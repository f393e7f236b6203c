// Tensors saved in shares under one mesh, whole again, and cut for another: what lets a
// checkpoint written by one mesh (any dp, zero, fsdp, tp, ep) resume on another. Each saving rank
// records, beside its values, how its piece was placed (Placement): which part of the whole its
// local tensor is along the model's axes (a layout, layout_of), and which elements of that local
// tensor it holds (its state share). The whole comes back from the pieces of every rank; a
// placement on the new mesh cuts it again (part_of_whole).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/parallel/placement.hpp"

namespace tessera {

// A placement as saved beside a piece: int64 [part, parts, split dim, blocks, local shape...]; a
// padded split (a vocabulary's) records its true size as -whole in place of blocks. The format of
// Tessera's checkpoints (their optimizer layouts): kept stable so older ones still load.
TESSERA_API at::Tensor layout_of(const Placement& p, at::IntArrayRef local_shape);

// One rank's saved piece of one tensor.
struct SavedShare {
  at::Tensor layout;            // layout_of(...) when saved; undefined: its local tensor was the whole
  std::int64_t begin = 0;       // the elements [begin, end) of the flattened local tensor,
  std::int64_t end = 0;         // of local_numel in all
  std::int64_t local_numel = 0;
  at::Tensor values;            // end - begin elements, any shape
};

// The whole tensor, flattened, from the pieces of every rank that saved one: each part's shares
// laid end to end (they must tile it exactly: a hole or an overlap is an error, never zeros), then
// the parts joined along their split (a padded vocabulary's padding dropped). Throws
// tessera::Error whose message continues the tensor's name ("... has 3 elements for the range
// [0, 4)", "... was saved in 2 parts, 1 were found").
TESSERA_API at::Tensor join_saved_shares(const std::vector<SavedShare>& shares);

// This rank's part of `whole` (any shape with p.whole_numel() elements) under placement `p`,
// flattened: the new mesh's cut of a tensor whole again. `whole` itself when p cuts nothing.
TESSERA_API at::Tensor part_of_whole(const at::Tensor& whole, const Placement& p);

}  // namespace tessera
