#include "tessera/parallel/pipeline_parallel.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <string>

#include "tessera/error.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera {

namespace {
constexpr std::int64_t kMaxDims = 6;  // the header's room: [dims, dtype, size 0 .. size 5]
}  // namespace

void PendingSends::add(std::int64_t tag, std::vector<at::Tensor> tensors,
                       std::vector<std::shared_ptr<PendingCollective>> sends) {
  Transfer& transfer = transfers_[tag];
  for (auto& t : tensors) transfer.tensors.push_back(std::move(t));
  for (auto& s : sends) transfer.sends.push_back(std::move(s));
}

void PendingSends::wait(std::int64_t tag) {
  const auto it = transfers_.find(tag);
  if (it == transfers_.end()) return;
  for (auto& s : it->second.sends) s->wait();
  transfers_.erase(it);
}

void PendingSends::wait() {
  for (auto& [tag, transfer] : transfers_) {
    for (auto& s : transfer.sends) s->wait();
  }
  transfers_.clear();
}

std::vector<std::pair<std::int64_t, std::int64_t>> PipelineParallel::block_ranges(
    std::int64_t blocks, std::int64_t stages, const std::vector<std::int64_t>& split_points) {
  if (stages > blocks) {
    throw Error("pipeline: " + std::to_string(stages) + " stages of " + std::to_string(blocks) +
                " blocks; every stage needs a block");
  }
  std::vector<std::int64_t> starts{0};
  if (split_points.empty()) {
    // Balanced by count: the first (blocks % stages) stages take one block more.
    for (std::int64_t s = 1; s < stages; ++s) {
      starts.push_back(starts.back() + blocks / stages + (s - 1 < blocks % stages ? 1 : 0));
    }
  } else {
    if (static_cast<std::int64_t>(split_points.size()) != stages - 1) {
      throw Error("pipeline: " + std::to_string(split_points.size()) + " split points for " + std::to_string(stages) +
                  " stages");
    }
    for (const std::int64_t point : split_points) {
      if (point <= starts.back() || point >= blocks) {
        throw Error("pipeline: split point " + std::to_string(point) + " does not fall inside the " +
                    std::to_string(blocks) + " blocks after the previous one");
      }
      starts.push_back(point);
    }
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (std::size_t s = 0; s < starts.size(); ++s) {
    ranges.emplace_back(starts[s], s + 1 < starts.size() ? starts[s + 1] : blocks);
  }
  return ranges;
}

PipelineParallel::PipelineParallel(std::int64_t blocks)
    : group_(make_single_rank_communicator()), gradients_(group_), local_{PipelineStage{0, 0, blocks, true, true}} {}

PipelineParallel::PipelineParallel(std::shared_ptr<Communicator> group, std::int64_t blocks,
                                   std::int64_t stages_per_rank, const std::vector<std::int64_t>& split_points,
                                   std::shared_ptr<Communicator> gradients)
    : group_(std::move(group)), gradients_(std::move(gradients)) {
  if (!group_) throw Error("PipelineParallel: no group");
  if (!gradients_) gradients_ = group_;
  if (gradients_->world_size() != group_->world_size() || gradients_->rank() != group_->rank()) {
    throw Error("PipelineParallel: the gradients' group is not the pipeline group's ranks");
  }
  size_ = group_->world_size();
  rank_ = group_->rank();
  stages_ = size_ * stages_per_rank;
  const auto ranges = block_ranges(blocks, stages_, split_points);
  for (std::int64_t s = rank_; s < stages_; s += size_) {
    const auto [first, end] = ranges[static_cast<std::size_t>(s)];
    local_.push_back(PipelineStage{s, first, end, s == 0, s == stages_ - 1});
  }
}

PipelineParallel PipelineParallel::of(const RunContext& run, std::int64_t blocks) {
  if (!run.mesh || run.mesh->dims().pp == 1) return PipelineParallel(blocks);
  const ParallelDims& dims = run.mesh->dims();
  return PipelineParallel(run.mesh->group_ptr({MeshAxis::pp}), blocks, dims.pp_stages_per_rank, dims.pp_split_points);
}

PipelineParallel PipelineParallel::transport_of(const RunContext& run) {
  if (!run.mesh || run.mesh->dims().pp == 1) return PipelineParallel(1);
  const ParallelDims& dims = run.mesh->dims();
  // One block per stage stands for whatever the model holds there.
  return PipelineParallel(run.mesh->group_ptr({MeshAxis::pp}), dims.pp * dims.pp_stages_per_rank,
                          dims.pp_stages_per_rank, {}, run.mesh->pipeline_gradients_ptr());
}

std::int64_t PipelineParallel::local_index(std::int64_t stage) const {
  for (std::size_t i = 0; i < local_.size(); ++i) {
    if (local_[i].index == stage) return static_cast<std::int64_t>(i);
  }
  return -1;
}

bool PipelineParallel::holds_block(std::int64_t block) const {
  for (const auto& s : local_) {
    if (block >= s.first_block && block < s.end_block) return true;
  }
  return false;
}

void PipelineParallel::send(const at::Tensor& t, std::int64_t to_stage, std::int64_t tag, PendingSends& pending,
                            PipelineFlow flow) const {
  if (t.dim() > kMaxDims) throw Error("pipeline: cannot send a tensor of " + std::to_string(t.dim()) + " dimensions");
  at::Tensor header = at::zeros({2 + kMaxDims}, at::kLong);
  auto* h = header.data_ptr<std::int64_t>();
  h[0] = t.dim();
  h[1] = static_cast<std::int64_t>(t.scalar_type());
  for (std::int64_t d = 0; d < t.dim(); ++d) h[2 + d] = t.size(d);
  at::Tensor data = t.detach().contiguous();
  const std::int64_t peer = rank_of(to_stage);
  Communicator& group = group_of(flow);
  std::vector<std::shared_ptr<PendingCollective>> sends{group.send_async(header, peer, static_cast<int>(2 * tag)),
                                                        group.send_async(data, peer, static_cast<int>(2 * tag + 1))};
  pending.add(tag, {header, data}, std::move(sends));
}

at::Tensor PipelineParallel::receive(std::int64_t from_stage, std::int64_t tag, const c10::Device& device,
                                     PipelineFlow flow) const {
  const std::int64_t peer = rank_of(from_stage);
  Communicator& group = group_of(flow);
  at::Tensor header = at::zeros({2 + kMaxDims}, at::kLong);
  group.recv_async(header, peer, static_cast<int>(2 * tag))->wait();
  const auto* h = header.data_ptr<std::int64_t>();
  if (h[0] < 0 || h[0] > kMaxDims) throw Error("pipeline: a malformed header from stage " + std::to_string(from_stage));
  const std::vector<std::int64_t> sizes(h + 2, h + 2 + h[0]);
  at::Tensor data = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(h[1])).device(device));
  group.recv_async(data, peer, static_cast<int>(2 * tag + 1))->wait();
  return data;
}

}  // namespace tessera
