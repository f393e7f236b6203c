#include "tessera/parallel/expert_parallel.hpp"

#include <utility>

#include "tessera/error.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera {

ExpertParallel::ExpertParallel() : group_(make_single_rank_communicator()) {}

ExpertParallel::ExpertParallel(std::shared_ptr<Communicator> group) : group_(std::move(group)) {
  if (!group_) throw Error("ExpertParallel: no group");
  size_ = group_->world_size();
  rank_ = group_->rank();
}

ExpertParallel ExpertParallel::of(const RunContext& run) {
  if (!run.mesh || run.mesh->dims().ep == 1) return ExpertParallel();
  return ExpertParallel(run.mesh->expert_parallel_ptr());
}

}  // namespace tessera
