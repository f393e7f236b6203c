// KvCache (tessera/components/kv_cache.hpp): slots of keys and values kept between a decoder's
// forward passes, and which of them each query sees.
#include "tessera/components/kv_cache.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <string>

#include "tessera/error.hpp"

namespace tessera {

KvCache::KvCache(std::int64_t batch, std::int64_t capacity, std::size_t layers, c10::Device device)
    : batch_(batch), capacity_(capacity), device_(device), layers_(layers), derived_(layers) {
  if (batch < 1 || capacity < 1) {
    throw Error("KvCache: a batch of " + std::to_string(batch) + " and a capacity of " + std::to_string(capacity) +
                " slots; both must be at least 1");
  }
  key_positions_ = at::full({batch, capacity}, -1, at::TensorOptions().dtype(at::kLong).device(device));
}

void KvCache::begin_pass(const at::Tensor& positions) {
  if (pass_.defined()) throw Error("KvCache: a pass began before the last one ended");
  if (positions.dim() != 2 || positions.size(0) != batch_) {
    throw Error("KvCache: a pass' positions must be [" + std::to_string(batch_) + ", n]");
  }
  const std::int64_t n = positions.size(1);
  if (length_ + n > capacity_) {
    throw Error("KvCache: " + std::to_string(length_) + " slots written and " + std::to_string(n) +
                " more exceed its capacity of " + std::to_string(capacity_));
  }
  // Positions on the device would cost a wait to inspect: assume padding there.
  padded_ = padded_ || !positions.device().is_cpu() || positions.lt(0).any().item<bool>();
  pass_ = positions.to(device_, at::kLong);
  key_positions_.narrow(1, length_, n).copy_(pass_);
}

at::Tensor KvCache::pass_positions() const {
  if (!pass_.defined()) throw Error("KvCache: pass_positions outside a pass");
  return pass_.clamp_min(0);
}

std::vector<at::Tensor> KvCache::append(std::size_t layer, const std::vector<at::Tensor>& tensors) {
  if (!pass_.defined()) throw Error("KvCache: append outside a pass");
  if (layer >= layers_.size()) {
    throw Error("KvCache: layer " + std::to_string(layer) + " of a cache for " + std::to_string(layers_.size()));
  }
  std::vector<at::Tensor>& kept = layers_[layer];
  const std::int64_t n = pass_.size(1);
  if (kept.empty()) {
    // Allocated whole at the first write: decode never reallocates or copies the past.
    for (const at::Tensor& t : tensors) {
      kept.push_back(at::empty({batch_, t.size(1), capacity_, t.size(3)}, t.options()));
    }
  }
  if (kept.size() != tensors.size()) throw Error("KvCache: layer " + std::to_string(layer) + " changed what it keeps");
  std::vector<at::Tensor> so_far;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    kept[i].narrow(2, length_, n).copy_(tensors[i]);
    so_far.push_back(kept[i].narrow(2, 0, length_ + n));
  }
  return so_far;
}

at::Tensor KvCache::visible(std::int64_t window) const {
  if (!pass_.defined()) throw Error("KvCache: visible outside a pass");
  for (const auto& [w, mask] : visible_) {
    if (w == window) return mask;
  }
  const std::int64_t n = pass_.size(1);
  if (n == 1 && !padded_ && (window <= 0 || window > length_)) return at::Tensor();
  const at::Tensor keys = key_positions_.narrow(1, 0, length_ + n).unsqueeze(1);  // [B, 1, S]
  const at::Tensor queries = pass_.unsqueeze(2);                                    // [B, n, 1]
  at::Tensor seen = keys.ge(0).logical_and(keys.le(queries));
  if (window > 0) seen = seen.logical_and(keys.gt(queries - window));
  visible_.emplace_back(window, seen.logical_or(queries.lt(0)).unsqueeze(1));
  return visible_.back().second;
}

void KvCache::end_pass() {
  if (!pass_.defined()) throw Error("KvCache: end_pass outside a pass");
  length_ += pass_.size(1);
  pass_ = at::Tensor();
  visible_.clear();
}

void KvCache::abandon_pass() {
  if (!pass_.defined()) return;
  key_positions_.narrow(1, length_, pass_.size(1)).fill_(-1);
  pass_ = at::Tensor();
  visible_.clear();
}

std::int64_t KvCache::bytes() const {
  std::int64_t n = 0;
  for (const auto& layer : layers_) {
    for (const at::Tensor& t : layer) n += static_cast<std::int64_t>(t.nbytes());
  }
  return n;
}

at::Tensor KvCache::derived(std::size_t layer, const std::string& name, const std::function<at::Tensor()>& make) {
  if (layer >= derived_.size()) {
    throw Error("KvCache: layer " + std::to_string(layer) + " of a cache for " + std::to_string(derived_.size()));
  }
  auto& kept = derived_[layer];
  for (const auto& [kept_name, tensor] : kept) {
    if (kept_name == name) return tensor;
  }
  at::Tensor made = make();
  kept.emplace_back(name, std::move(made));
  return kept.back().second;
}

}  // namespace tessera
