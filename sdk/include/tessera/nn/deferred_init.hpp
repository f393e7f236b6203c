// Sharded initialisation: building a model without memory for its parameters.
//
// The host builds a run's components inside a DeferredInitScope. A model that supports it then
// creates its parameters on the meta device (shapes and dtypes, no storage) and initialises
// nothing. Whoever owns the model afterwards gives the parameters storage and asks the model for
// their initial values (Model::initialize_parameters): the trainer all at once, or a sharding
// strategy (fsdp) one wrapping unit at a time, keeping only its shard, so no rank ever holds the
// whole model. A model's initial values depend only on its init seed and each parameter's name
// (init_generator), so any subset, in any order, gets exactly the values the model has when
// built without deferral.
//
// A model that cannot defer (it reads weights from a file at construction) builds inside a
// DeferredInitSuspension and is materialised as usual.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "tessera/export.hpp"

namespace tessera {

// While alive, deferring_init() is true on this thread (nests).
class TESSERA_API DeferredInitScope {
 public:
  DeferredInitScope();
  ~DeferredInitScope();
  DeferredInitScope(const DeferredInitScope&) = delete;
  DeferredInitScope& operator=(const DeferredInitScope&) = delete;
};

// While alive, deferring_init() is false on this thread, whatever scope is open.
class TESSERA_API DeferredInitSuspension {
 public:
  DeferredInitSuspension();
  ~DeferredInitSuspension();
  DeferredInitSuspension(const DeferredInitSuspension&) = delete;
  DeferredInitSuspension& operator=(const DeferredInitSuspension&) = delete;

 private:
  int saved_;
};

TESSERA_API bool deferring_init();

// A new parameter tensor: on the meta device while deferring, else uninitialised on the CPU.
TESSERA_API at::Tensor new_parameter(at::IntArrayRef sizes);

// `param` (on the meta device) takes `storage` (same sizes and dtype, real memory, often a view
// of a flat buffer) as its data, keeping its identity: the optimizer and the module still hold
// it. LibTorch's set_data refuses meta -> real, hence this.
TESSERA_API void materialize_parameter(const at::Tensor& param, const at::Tensor& storage);

// The generator for the initial values of parameter `name` of a model whose init seed is
// `init_seed`: independent of the order parameters are initialised in and of the device.
TESSERA_API at::Generator init_generator(std::uint64_t init_seed, const std::string& name);

// A seed for a model's init, drawn from LibTorch's default CPU generator (so the run's seed
// fixes it, and seeding differently gives other weights).
TESSERA_API std::uint64_t draw_init_seed();

}  // namespace tessera
