#include "flat_unit.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>

#include "tessera/nn/deferred_init.hpp"
#include "tessera/error.hpp"

namespace tessera_plugins {

FlatUnit::FlatUnit(std::vector<at::Tensor> params, tessera::Communicator& comm, GradReduction reduction,
                   bool shard_parameters, UnitPrecision precision, const DeferredUnitInit* deferred)
    : comm_(comm),
      reduction_(reduction),
      shard_parameters_(shard_parameters),
      rank_(comm.rank()),
      world_(comm.world_size()),
      params_(std::move(params)) {
  if (params_.empty()) throw tessera::Error("parallel: a unit with no parameters");
  // Deferred parameters (on the meta device) may share a unit with ones that have storage (an
  // adapter's, on the run's device): the unit's device is then the deferred ones'.
  const bool meta = std::any_of(params_.begin(), params_.end(), [](const at::Tensor& p) { return p.is_meta(); });
  if (meta && !deferred) throw tessera::Error("parallel: parameters on the meta device and no initializer");
  auto options = params_.front().options();
  if (meta) options = options.device(deferred->device);
  for (const auto& p : params_) {
    if (p.scalar_type() != options.dtype().toScalarType() || (!p.is_meta() && p.device() != options.device())) {
      throw tessera::Error("parallel: the parameters of one unit must share dtype and device, got " +
                           std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() + " and " +
                           std::string(c10::toString(options.dtype().toScalarType())) + " on " +
                           options.device().str());
    }
    offsets_.push_back(numel_);
    numel_ += p.numel();
  }
  shard_numel_ = (numel_ + world_ - 1) / world_;
  master_dtype_ = options.dtype().toScalarType();
  param_dtype_ = precision.param.value_or(master_dtype_);
  reduce_dtype_ = precision.reduce.value_or(master_dtype_);
  if (param_dtype_ != master_dtype_ && !shard_parameters_) {
    throw tessera::Error("parallel: a param dtype other than the parameters' own needs sharded parameters (fsdp)");
  }
  if (reduction_ == GradReduction::none && !shard_parameters_) {
    throw tessera::Error("parallel: a unit without gradients is for sharded parameters (fsdp) only");
  }

  // The parameters' values move into one padded buffer; each parameter becomes a view of it.
  c10::NoGradGuard no_grad;
  at::Tensor master = at::zeros({shard_numel_ * world_}, options);
  if (meta) {
    // Deferred: the buffer is the deferred parameters' first storage, the others' values are
    // copied in; every rank takes rank 0's values.
    std::vector<at::Tensor> deferred_params;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].is_meta()) {
        tessera::materialize_parameter(params_[i], view_of(master, i));
        deferred_params.push_back(params_[i]);
      } else {
        view_of(master, i).copy_(params_[i].detach());
      }
    }
    deferred->initialize(deferred_params);
    comm_.broadcast(master, 0);
  } else {
    for (std::size_t i = 0; i < params_.size(); ++i) view_of(master, i).copy_(params_[i].detach());
  }
  // Under a param dtype the gathered buffer is a cast of the master weights, which only the
  // shard keeps.
  full_ = casts_parameters() ? master.to(param_dtype_) : master;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor view = view_of(full_, i);
    params_[i].set_data(view);
    full_views_.push_back(view);
  }
  if (reduction_ != GradReduction::all_reduce) {
    if (trains()) grad_shard_ = at::zeros({shard_numel_}, options);
    // zero keeps whole parameters, so its shard is a slice of them; fsdp keeps the shard alone.
    param_shard_ = master.narrow(0, shard_begin(), shard_numel_);
    if (shard_parameters_) {
      param_shard_ = param_shard_.clone();
      free_full();
    }
  }
  if (reduction_ == GradReduction::all_reduce || reduction_ == GradReduction::reduce_scatter_final) {
    grad_flat_ = at::zeros({reduction_ == GradReduction::all_reduce ? numel_ : shard_numel_ * world_}, options);
  }
  zero_grad();
}

std::vector<at::Tensor> FlatUnit::chunks(const at::Tensor& flat) const {
  std::vector<at::Tensor> out;
  for (std::int64_t r = 0; r < world_; ++r) out.push_back(flat.narrow(0, r * shard_numel_, shard_numel_));
  return out;
}

std::pair<std::int64_t, std::int64_t> FlatUnit::shard_range(std::size_t i) const {
  const std::int64_t begin = std::max(offsets_[i], shard_begin());
  const std::int64_t end = std::min(offsets_[i] + params_[i].numel(), shard_begin() + shard_numel_);
  if (end <= begin) return {0, 0};
  return {begin - shard_begin(), end - shard_begin()};
}

std::pair<std::int64_t, std::int64_t> FlatUnit::owned_range(std::size_t i) const {
  if (reduction_ == GradReduction::all_reduce) return {0, params_[i].numel()};
  const auto [begin, end] = shard_range(i);
  if (end <= begin) return {0, 0};
  return {begin + shard_begin() - offsets_[i], end + shard_begin() - offsets_[i]};
}

at::Tensor FlatUnit::view_of(const at::Tensor& flat, std::size_t i) const {
  return flat.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes());
}

at::Tensor FlatUnit::gather_master() {
  at::Tensor flat = new_master();
  std::vector<at::Tensor> outputs = chunks(flat);
  comm_.all_gather(outputs, shard_parameters_ ? param_shard_ : param_shard_.clone());
  return flat;
}

at::Tensor FlatUnit::new_master() const {
  return at::empty({shard_numel_ * world_}, param_shard_.options());
}

void FlatUnit::load_master(const at::Tensor& flat) {
  param_shard_.copy_(flat.narrow(0, shard_begin(), shard_numel_));
  if (gathered_) full_.copy_(flat);
}

void FlatUnit::shard_from_full() {
  if (shard_parameters_) param_shard_.copy_(full_.narrow(0, shard_begin(), shard_numel_));
}

void FlatUnit::zero_grad() {
  if (grad_flat_.defined()) {
    grad_flat_.zero_();
    // Autograd adds into a .grad that exists: backward accumulates straight into the bucket.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i].mutable_grad() = grad_flat_.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes());
    }
  } else {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  }
  if (grad_shard_.defined()) grad_shard_.zero_();
}

bool FlatUnit::mark_ready() { return ++ready_ == params_.size(); }

void FlatUnit::reset_ready() { ready_ = 0; }

void FlatUnit::launch_reduction(bool last_micro_batch) {
  switch (reduction_) {
    case GradReduction::all_reduce:
      if (!last_micro_batch) break;
      if (reduce_dtype_ == master_dtype_) {
        pending_ = comm_.all_reduce_async(grad_flat_);
      } else {
        scatter_in_ = grad_flat_.to(reduce_dtype_);
        pending_ = comm_.all_reduce_async(scatter_in_);
      }
      break;
    case GradReduction::reduce_scatter_final:
      if (last_micro_batch) {
        if (reduce_dtype_ == master_dtype_) {
          std::vector<at::Tensor> inputs = chunks(grad_flat_);
          pending_ = comm_.reduce_scatter_async(grad_shard_, inputs);
        } else {
          scatter_in_ = grad_flat_.to(reduce_dtype_);
          scatter_out_ = at::empty({shard_numel_}, scatter_in_.options());
          std::vector<at::Tensor> inputs = chunks(scatter_in_);
          pending_ = comm_.reduce_scatter_async(scatter_out_, inputs);
        }
      }
      break;
    case GradReduction::none:
      break;
    case GradReduction::reduce_scatter_each: {
      // This backward's gradients leave the parameters for a flat buffer in flight; only the
      // reduced shard is kept, so whole gradients never outlive their unit's backward.
      scatter_in_ = at::zeros({shard_numel_ * world_}, grad_shard_.options().dtype(reduce_dtype_));
      for (std::size_t i = 0; i < params_.size(); ++i) {
        at::Tensor& g = params_[i].mutable_grad();
        if (g.defined()) scatter_in_.narrow(0, offsets_[i], params_[i].numel()).copy_(g.reshape({-1}));
        g = at::Tensor();
      }
      scatter_out_ = at::empty({shard_numel_}, scatter_in_.options());
      std::vector<at::Tensor> inputs = chunks(scatter_in_);
      pending_ = comm_.reduce_scatter_async(scatter_out_, inputs);
      break;
    }
  }
}

void FlatUnit::wait_reduction() {
  if (!pending_) return;
  pending_->wait();
  pending_.reset();
  if (reduction_ == GradReduction::reduce_scatter_each) {
    grad_shard_.add_(scatter_out_);
  } else if (reduction_ == GradReduction::all_reduce && scatter_in_.defined()) {
    grad_flat_.copy_(scatter_in_);
  } else if (scatter_out_.defined()) {
    grad_shard_.copy_(scatter_out_);
  }
  scatter_in_ = at::Tensor();
  scatter_out_ = at::Tensor();
}

at::Tensor FlatUnit::owned_gradient() const { return grad_shard_.defined() ? grad_shard_ : grad_flat_; }

void FlatUnit::take_first_replicas_shard(tessera::Communicator& replicas) {
  c10::NoGradGuard no_grad;
  replicas.broadcast(param_shard_, 0);
}

std::vector<at::Tensor> FlatUnit::owned_gradient_pieces(const std::vector<bool>& counted) const {
  std::vector<at::Tensor> pieces;
  const bool whole = !grad_shard_.defined();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!counted[i]) continue;
    if (whole) {
      pieces.push_back(grad_flat_.narrow(0, offsets_[i], params_[i].numel()));
      continue;
    }
    const auto [begin, end] = shard_range(i);
    if (end > begin) pieces.push_back(grad_shard_.narrow(0, begin, end - begin));
  }
  return pieces;
}

std::shared_ptr<tessera::PendingCollective> FlatUnit::start_gather() {
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  const std::size_t bytes = static_cast<std::size_t>(shard_numel_ * world_) * full_.element_size();
  if (storage->nbytes() != bytes) {
    // Freed (fsdp): the same storage object gets memory again, so every view of it (the
    // parameters', and those autograd saved for backward) sees the gathered values. A CUDA
    // allocator allocates on the current device: make it the storage's own (a single-process
    // run on cuda:1 has cuda:0 current).
    c10::OptionalDeviceGuard on_storage_device;
    if (full_.device().is_cuda()) on_storage_device.reset_device(full_.device());
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
    storage->set_nbytes(bytes);
  }
  gathered_ = true;
  std::vector<at::Tensor> outputs = chunks(full_);
  // zero's shard is a slice of full_ itself: send a copy so input and output never alias. Under
  // a param dtype the shard travels cast; the cast lives until the next gather.
  gather_in_ = casts_parameters() ? param_shard_.to(param_dtype_) : shard_parameters_ ? param_shard_ : param_shard_.clone();
  return comm_.all_gather_async(outputs, gather_in_);
}

// The memory goes back to the allocator at once, past the hold c10d keeps on a collective's
// tensors until it is waited for: the caller must have waited for any gather into it
// (DataParallel::release does). That wait orders the compute stream after the gather, and the
// allocator hands the block out again only to work on that same stream, so nothing reuses it
// early; a gather on a side stream would need that stream recorded on the block first.
void FlatUnit::free_full() {
  if (!shard_parameters_) return;
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  gathered_ = false;
}

void FlatUnit::point_at_shard() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto [begin, end] = shard_range(i);
    params_[i].set_data(param_shard_.narrow(0, begin, end - begin));
    params_[i].mutable_grad() = grad_shard_.narrow(0, begin, end - begin);
  }
}

void FlatUnit::point_at_full() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i].set_data(full_views_[i]);
    params_[i].mutable_grad() = at::Tensor();  // zero_grad() points it at the bucket again
  }
}

std::int64_t FlatUnit::parameter_bytes() const {
  if (shard_parameters_) return shard_numel_ * static_cast<std::int64_t>(param_shard_.element_size());
  return shard_numel_ * world_ * static_cast<std::int64_t>(full_.element_size());
}

std::int64_t FlatUnit::gradient_bytes() const {
  std::int64_t n = 0;
  if (grad_flat_.defined()) n += static_cast<std::int64_t>(grad_flat_.nbytes());
  if (grad_shard_.defined()) n += static_cast<std::int64_t>(grad_shard_.nbytes());
  return n;
}

}  // namespace tessera_plugins
