// The sharded-region random stream: a generator state per device type that scopes swap into the
// default generator (a swap of state tensors, so it works for every generator LibTorch has).
#include "tessera/parallel/sharded_rng.hpp"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/tensor.h>

#include <map>
#include <mutex>
#include <optional>

#include "tessera/error.hpp"

namespace tessera {
namespace {

struct Stream {
  std::mutex mutex;
  std::optional<std::uint64_t> seed;
  std::map<c10::DeviceType, at::Tensor> states;
};

Stream& stream() {
  static Stream* s = new Stream;  // leaked: used until the process ends
  return *s;
}

c10::Device generator_device(const c10::Device& device) {
  if (device.is_cuda() && !device.has_index()) return c10::Device(c10::kCUDA, 0);
  return device;
}

at::Tensor generator_state(const c10::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(generator_device(device));
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(generator_device(device));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The stream's first state on `device`: the default generator seeded with the stream's seed,
// taken without disturbing the default generator.
at::Tensor first_state(const c10::Device& device, std::uint64_t seed) {
  at::Generator gen = at::globalContext().defaultGenerator(generator_device(device));
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor outside = gen.get_state();
  gen.set_current_seed(seed);
  at::Tensor state = gen.get_state();
  gen.set_state(outside);
  return state;
}

const char* key_of(c10::DeviceType type) { return type == c10::kCUDA ? "cuda" : "cpu"; }

}  // namespace

void ShardedRng::seed(std::uint64_t seed, std::int64_t rank) {
  Stream& s = stream();
  std::lock_guard<std::mutex> lock(s.mutex);
  // Megatron-LM's offset, so the stream is not the default one of another run's seed.
  s.seed = seed + 2718 + static_cast<std::uint64_t>(rank);
  s.states.clear();
}

bool ShardedRng::seeded() {
  Stream& s = stream();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.seed.has_value();
}

at::Tensor ShardedRng::state(const c10::Device& device) {
  Stream& s = stream();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.states.find(device.type());
  return it == s.states.end() ? at::Tensor() : it->second;
}

void ShardedRng::set_state(const c10::Device& device, const at::Tensor& state) {
  Stream& s = stream();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (state.defined()) {
    s.states[device.type()] = state.clone();
  } else {
    s.states.erase(device.type());
  }
}

thread_local int scope_depth = 0;  // open scopes on this thread

ShardedRng::Scope::Scope(const c10::Device& device) : device_(device) {
  if (scope_depth++ > 0) {
    nested_ = true;
    return;
  }
  Stream& s = stream();
  at::Tensor inside;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.seed) {
      --scope_depth;
      throw Error("ShardedRng: a sharded region drew random numbers before the host seeded the stream");
    }
    auto it = s.states.find(device.type());
    inside = it != s.states.end() ? it->second : first_state(device, *s.seed);
  }
  outside_ = generator_state(device_);
  set_generator_state(device_, inside);
}

ShardedRng::Scope::~Scope() {
  --scope_depth;
  if (nested_) return;
  Stream& s = stream();
  const at::Tensor inside = generator_state(device_);
  set_generator_state(device_, outside_);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.states[device_.type()] = inside;
}

StateDict ShardedRng::state_dict() {
  Stream& s = stream();
  std::lock_guard<std::mutex> lock(s.mutex);
  StateDict out;
  if (!s.seed) return out;
  out["seed"] = at::tensor({static_cast<std::int64_t>(*s.seed)}, at::kLong);
  for (const auto& [type, state] : s.states) out[key_of(type)] = state.clone();
  return out;
}

void ShardedRng::load_state_dict(const StateDict& state) {
  Stream& s = stream();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.states.clear();
  const auto seed = state.find("seed");
  if (seed == state.end()) return;  // saved without a stream: it starts afresh from seed()
  s.seed = static_cast<std::uint64_t>(seed->second.item<std::int64_t>());
  for (const auto type : {c10::kCPU, c10::kCUDA}) {
    const auto it = state.find(key_of(type));
    if (it != state.end()) s.states[type] = it->second.clone();
  }
}

}  // namespace tessera
