#include "tessera/core/checkpoint/generator_state.hpp"

#include <ATen/Context.h>
#include <ATen/ops/tensor.h>

#include "tessera/parallel/sharded_rng.hpp"

namespace tessera::core {

StateDict capture_generators(const c10::Device& device, ShardRanks owner) {
  StateDict rng;
  rng["cpu"] = at::globalContext().defaultGenerator(c10::Device(c10::kCPU)).get_state();
  if (device.is_cuda()) rng["cuda"] = at::globalContext().defaultGenerator(device).get_state();
  for (const auto& [key, state] : ShardedRng::state_dict()) rng["sharded/" + key] = state;
  if (ShardedRng::seeded()) rng["sharded/tp"] = at::tensor({owner.rank, owner.size}, at::kLong);
  return rng;
}

void restore_generators(const StateDict& rng, const c10::Device& device, ShardRanks owner) {
  // A Generator is a handle: setting the copy's state sets the global generator's.
  if (rng.count("cpu")) {
    at::Generator cpu = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
    cpu.set_state(rng.at("cpu"));
  }
  if (rng.count("cuda") && device.is_cuda()) {
    at::Generator cuda = at::globalContext().defaultGenerator(device);
    cuda.set_state(rng.at("cuda"));
  }
  StateDict sharded;
  for (const auto& [key, state] : rng) {
    if (key.rfind("sharded/", 0) == 0) sharded[key.substr(8)] = state;
  }
  const auto saved_owner = sharded.find("tp");
  if (saved_owner != sharded.end() && saved_owner->second.numel() == 2 &&
      saved_owner->second[0].item<std::int64_t>() == owner.rank && saved_owner->second[1].item<std::int64_t>() == owner.size) {
    sharded.erase(saved_owner);
    ShardedRng::load_state_dict(sharded);
  }
}

}  // namespace tessera::core
