// Random numbers for activations that differ across tensor-parallel ranks. Replicated activations
// (the residual stream without sequence parallelism) must draw the same dropout masks on every
// tensor-parallel rank, and do: every rank's default generator starts from the run's seed and
// draws the same numbers. Sharded activations (a rank's own attention heads, its own slice of the
// sequence) must draw masks of their own, as Megatron-LM's RNG tracker gives them: inside a
// ShardedRng::Scope the default generator draws from a second stream seeded by (seed, tp rank).
// Activation checkpointing replays both streams, and checkpoints save and restore both.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

#include "tessera/export.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

class TESSERA_API ShardedRng {
 public:
  // The host, once per run before any component draws: the stream of tensor-parallel rank `rank`.
  static void seed(std::uint64_t seed, std::int64_t rank);
  // Whether seed() was called (runs without tensor parallelism never need the stream).
  static bool seeded();

  // While alive, the default generator of `device` draws from the sharded stream; afterwards it
  // continues where it was, and the sharded stream where this scope left it. A scope opened
  // inside another (on the same thread) changes nothing: the outer one already swapped.
  class TESSERA_API Scope {
   public:
    explicit Scope(const c10::Device& device);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    c10::Device device_;
    at::Tensor outside_;  // the default generator's state on entry
    bool nested_ = false;
  };

  // The stream's state on `device` (its generator's state tensor); undefined before it drew there.
  static at::Tensor state(const c10::Device& device);
  static void set_state(const c10::Device& device, const at::Tensor& state);

  // For checkpoints: "sharded_rng/cpu", "sharded_rng/cuda" (those that drew) and the seed.
  static StateDict state_dict();
  static void load_state_dict(const StateDict& state);
};

}  // namespace tessera
