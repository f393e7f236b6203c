// ParallelStrategy's frozen copy of the weights (tessera/components/strategy.hpp): a loss's
// reference model when the run trains the whole model (loss/dpo without adapters). The copy lives
// beside each storage the strategy holds the parameters in, and a reference forward exchanges
// the memory under those storages: every view of them (the parameters, a strategy's flat
// buffers and shards) then reads the copy, with nothing copied and no second model built.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <set>
#include <utility>
#include <vector>

#include "tessera/components/model.hpp"
#include "tessera/components/strategy.hpp"
#include "tessera/error.hpp"

namespace tessera {

struct ParallelStrategy::ReferenceWeights {
  // Per held storage: the storage, and a byte buffer of the same size holding the copy.
  std::vector<std::pair<c10::Storage, at::Tensor>> copies;
  std::int64_t bytes = 0;
};

namespace {

// A byte view over the whole memory of a storage.
at::Tensor bytes_of(const c10::Storage& storage, const c10::Device& device) {
  return at::from_blob(storage.mutable_data(), {static_cast<std::int64_t>(storage.nbytes())},
                       at::TensorOptions().dtype(at::kByte).device(device));
}

// Exchanges the memory under two storages of the same size; every view of either follows.
void swap_memory(c10::StorageImpl& a, c10::StorageImpl& b) {
  c10::DataPtr a_memory = a.set_data_ptr(c10::DataPtr(nullptr, a.device()));
  c10::DataPtr b_memory = b.set_data_ptr(std::move(a_memory));
  a.set_data_ptr(std::move(b_memory));
}

}  // namespace

std::vector<at::Tensor> ParallelStrategy::held_parameter_storages(Model& model) { return model.parameters(); }

void ParallelStrategy::keep_reference_weights(Model& model) {
  c10::NoGradGuard no_grad;
  release_derived_parameters();
  auto kept = std::make_shared<ReferenceWeights>();
  std::set<const c10::StorageImpl*> seen;
  for (const at::Tensor& held : held_parameter_storages(model)) {
    if (!held.defined() || !held.has_storage()) continue;
    const c10::Storage storage = held.storage();
    if (storage.nbytes() == 0 || !seen.insert(storage.unsafeGetStorageImpl()).second) continue;
    if (held.device().is_meta()) {
      throw Error("keep_reference_weights: a parameter is still on the meta device (deferred); the strategy must "
                  "give it storage first");
    }
    at::Tensor copy = at::empty({static_cast<std::int64_t>(storage.nbytes())},
                                at::TensorOptions().dtype(at::kByte).device(held.device()));
    copy.copy_(bytes_of(storage, held.device()));
    kept->bytes += static_cast<std::int64_t>(storage.nbytes());
    kept->copies.emplace_back(storage, std::move(copy));
  }
  reference_ = std::move(kept);
}

bool ParallelStrategy::keeps_reference_weights() const { return reference_ != nullptr; }

std::int64_t ParallelStrategy::reference_bytes() const { return reference_ ? reference_->bytes : 0; }

void ParallelStrategy::with_reference_weights(const std::function<void()>& fn) {
  if (!reference_) throw Error("with_reference_weights: no reference weights were kept (keep_reference_weights)");
  auto swap_all = [this] {
    for (auto& [storage, copy] : reference_->copies) {
      c10::StorageImpl& held = *storage.unsafeGetStorageImpl();
      if (held.nbytes() != copy.nbytes()) {
        throw Error("with_reference_weights: a parameter storage changed size since its reference copy was kept");
      }
      swap_memory(held, *copy.storage().unsafeGetStorageImpl());
    }
  };
  release_derived_parameters();
  swap_all();
  try {
    fn();
  } catch (...) {
    release_derived_parameters();
    swap_all();
    throw;
  }
  release_derived_parameters();
  swap_all();
}

}  // namespace tessera
