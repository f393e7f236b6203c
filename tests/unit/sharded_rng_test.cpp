// The sharded random stream of tensor parallelism: draws inside a scope come from a stream of
// (seed, tp rank) and leave the default generator where it was, so replicated activations keep
// drawing the same masks on every tensor-parallel rank whatever each draws for its own heads; the
// stream is saved and restored with checkpoints and replayed by activation checkpointing.
#include "tessera/parallel/sharded_rng.hpp"

#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <torch/csrc/autograd/autograd.h>

#include "tessera/nn/activation_checkpoint.hpp"

namespace tessera {
namespace sharded_rng_test {

void seed_default(std::uint64_t seed) {
  // A Generator is a handle: seeding the copy seeds the global generator.
  at::Generator cpu = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  cpu.set_current_seed(seed);
}
const c10::Device kCpu(c10::kCPU);

TEST(ShardedRng, ScopedDrawsLeaveTheDefaultStreamAsIfTheyNeverHappened) {
  ShardedRng::seed(5, 0);
  seed_default(5);
  const at::Tensor first = at::rand({4}), second = at::rand({4});
  seed_default(5);
  const at::Tensor a = at::rand({4});
  at::Tensor inside;
  {
    ShardedRng::Scope own(kCpu);
    inside = at::rand({100});
  }
  const at::Tensor c = at::rand({4});
  EXPECT_TRUE(a.equal(first));
  EXPECT_TRUE(c.equal(second)) << "the default stream went on as if nothing was drawn in the scope";
  EXPECT_FALSE(inside.narrow(0, 0, 4).equal(second)) << "the scope draws from a stream of its own";
}

TEST(ShardedRng, EachTensorParallelRankHasItsOwnStreamThatContinuesAcrossScopes) {
  auto draws = [](std::int64_t rank) {
    ShardedRng::seed(5, rank);
    at::Tensor one, two;
    {
      ShardedRng::Scope own(kCpu);
      one = at::rand({8});
    }
    {
      ShardedRng::Scope own(kCpu);
      two = at::rand({8});
    }
    return std::make_pair(one, two);
  };
  const auto rank0 = draws(0), again = draws(0), rank1 = draws(1);
  EXPECT_TRUE(rank0.first.equal(again.first) && rank0.second.equal(again.second)) << "the same rank, the same stream";
  EXPECT_FALSE(rank0.first.equal(rank0.second)) << "the second scope continues the stream";
  EXPECT_FALSE(rank0.first.equal(rank1.first)) << "another rank, another stream";
}

TEST(ShardedRng, ItsStateRoundTripsThroughAStateDict) {
  ShardedRng::seed(9, 1);
  {
    ShardedRng::Scope own(kCpu);
    at::rand({3});
  }
  const StateDict saved = ShardedRng::state_dict();
  at::Tensor expected;
  {
    ShardedRng::Scope own(kCpu);
    expected = at::rand({6});
  }
  ShardedRng::seed(1, 0);  // another run's stream, then the checkpoint's
  ShardedRng::load_state_dict(saved);
  ShardedRng::Scope own(kCpu);
  EXPECT_TRUE(at::rand({6}).equal(expected));
}

// A checkpointed block that drops out inside a sharded scope recomputes the same masks in
// backward: its gradient is the plain block's.
TEST(ShardedRng, ActivationCheckpointingReplaysTheShardedStream) {
  const BlockBody body = [](const at::Tensor& x) {
    ShardedRng::Scope own(x.device());
    return at::dropout(x * 2.0, 0.5, true);
  };
  auto gradient = [&](bool checkpointed) {
    ShardedRng::seed(3, 1);
    seed_default(3);
    at::Tensor x = at::ones({64}).requires_grad_(true);
    const at::Tensor y = checkpointed ? checkpoint_activations(body, x) : body(x);
    torch::autograd::backward({y.sum()});
    return x.grad().clone();
  };
  const at::Tensor plain = gradient(false), replayed = gradient(true);
  EXPECT_TRUE(replayed.equal(plain));
  EXPECT_GT(plain.eq(0).sum().item<std::int64_t>(), 0) << "dropout dropped something";
}

}  // namespace sharded_rng_test
}  // namespace tessera
