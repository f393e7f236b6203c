// Reentrant activation checkpointing: a custom autograd function whose forward runs the block
// without recording a graph and whose backward runs it again with one, then back-propagates
// through that graph (parameters' gradients accumulate as usual; the input's is returned).
#include "tessera/nn/activation_checkpoint.hpp"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>
#include <utility>

#include "tessera/error.hpp"
#include "tessera/parallel/sharded_rng.hpp"
#include "tessera/run/precision.hpp"

namespace tessera {
namespace {

// What the recomputation needs besides the input: the block, the generator states the forward
// pass started from (the default one and the tensor-parallel sharded stream's), and the autocast
// state it ran under.
struct Recompute : torch::CustomClassHolder {
  BlockBody body;
  c10::Device device{c10::kCPU};
  at::Tensor rng_state;
  at::Tensor sharded_rng_state;  // undefined where the stream never drew
  at::ScalarType autocast_dtype = at::kFloat;  // Float: autocast was off
};

at::Generator generator_for(const c10::Device& device) {
  return at::globalContext().defaultGenerator(device);
}

at::Tensor get_rng_state(const c10::Device& device) {
  at::Generator gen = generator_for(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = generator_for(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            c10::intrusive_ptr<Recompute> recompute) {
    ctx->save_for_backward({input});
    at::Tensor output = recompute->body(input);  // grad mode is off inside a custom forward
    ctx->saved_data["recompute"] = at::IValue::make_capsule(std::move(recompute));
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    // Taken out of the node: the block it holds often holds this graph in turn (an MoE layer
    // keeps its auxiliary loss), and LibTorch releases a node's saved variables after backward
    // but not its saved data, so leaving it would keep block and graph alive in a cycle.
    const auto found = ctx->saved_data.find("recompute");
    if (found == ctx->saved_data.end()) {
      throw Error("activation checkpointing: a checkpointed block's backward ran a second time; backward through "
                  "the same graph twice (retain_graph) is not supported with activation checkpointing");
    }
    const auto capsule = found->second.toCapsule();
    ctx->saved_data.erase(found);
    auto* recompute = static_cast<Recompute*>(capsule.get());
    at::Tensor detached = input.detach().requires_grad_(input.requires_grad());
    at::Tensor output;
    {
      // The same dropout masks as the forward pass, then the generator as it was: the
      // recomputation leaves no trace on the random stream.
      const at::Tensor now = get_rng_state(recompute->device);
      const at::Tensor sharded_now = ShardedRng::state(recompute->device);
      set_rng_state(recompute->device, recompute->rng_state);
      ShardedRng::set_state(recompute->device, recompute->sharded_rng_state);
      auto restore = [&] {
        set_rng_state(recompute->device, now);
        ShardedRng::set_state(recompute->device, sharded_now);
      };
      try {
        c10::AutoGradMode grad_mode(true);
        AutocastGuard autocast(recompute->device, recompute->autocast_dtype);
        output = recompute->body(detached);
      } catch (...) {
        restore();
        throw;
      }
      restore();
    }
    if (!output.requires_grad()) return {at::Tensor(), at::Tensor()};
    torch::autograd::backward({output}, {grad_outputs[0]});
    return {detached.requires_grad() ? detached.grad() : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint_activations(const BlockBody& body, const at::Tensor& input) {
  if (!c10::GradMode::is_enabled()) return body(input);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->body = body;
  recompute->device = input.device();
  recompute->rng_state = get_rng_state(recompute->device);
  recompute->sharded_rng_state = ShardedRng::state(recompute->device);
  const c10::DeviceType type = input.device().type();
  if (at::autocast::is_autocast_enabled(type)) recompute->autocast_dtype = at::autocast::get_autocast_dtype(type);
  // A block whose input needs no gradient may still hold parameters that do (the adapters of a
  // frozen base, whose embeddings feed the first block): the function records its node only
  // for an input that asks for a gradient, so it gets one that does (and drops that gradient).
  const at::Tensor recorded = input.requires_grad() ? input : input.detach().requires_grad_(true);
  return CheckpointFunction::apply(recorded, std::move(recompute));
}

}  // namespace tessera
