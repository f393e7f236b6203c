#include "tessera/nn/deferred_init.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorImpl.h>

#include <mutex>

#include "tessera/error.hpp"

namespace tessera {
namespace {

thread_local int deferral_depth = 0;

// splitmix64: spreads a seed over all 64 bits.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

DeferredInitScope::DeferredInitScope() { ++deferral_depth; }
DeferredInitScope::~DeferredInitScope() { --deferral_depth; }
DeferredInitSuspension::DeferredInitSuspension() : saved_(deferral_depth) { deferral_depth = 0; }
DeferredInitSuspension::~DeferredInitSuspension() { deferral_depth = saved_; }

bool deferring_init() { return deferral_depth > 0; }

at::Tensor new_parameter(at::IntArrayRef sizes) {
  return at::empty(sizes, at::TensorOptions().dtype(at::kFloat).device(deferring_init() ? at::kMeta : at::kCPU));
}

void materialize_parameter(const at::Tensor& param, const at::Tensor& storage) {
  if (!param.is_meta()) throw Error("materialize_parameter: the parameter already has storage");
  if (param.sizes() != storage.sizes() || param.scalar_type() != storage.scalar_type()) {
    throw Error("materialize_parameter: storage of shape " + c10::str(storage.sizes()) + " " +
                std::string(c10::toString(storage.scalar_type())) + " for a parameter of shape " +
                c10::str(param.sizes()) + " " + std::string(c10::toString(param.scalar_type())));
  }
  // What set_data does after its type check: the parameter's TensorImpl takes the storage,
  // sizes, strides, dtype, device and dispatch keys of `storage`; its autograd metadata (and
  // so its identity for the optimizer and autograd) stays.
  param.unsafeGetTensorImpl()->shallow_copy_from(storage.detach().getIntrusivePtr());
}

at::Generator init_generator(std::uint64_t init_seed, const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return at::make_generator<at::CPUGeneratorImpl>(mix(init_seed ^ mix(h)));
}

std::uint64_t draw_init_seed() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

}  // namespace tessera
