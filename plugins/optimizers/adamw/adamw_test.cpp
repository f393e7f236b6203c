// optimizer/adamw built through the real loader and factory on a tiny gpt: the update against a
// hand computation and against torch::optim::AdamW, undecayed norms and biases, set_lr, and a
// state-dict round trip that continues bit for bit.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/run/training_run.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"
#include "tessera/registry.hpp"
#include "../multi_tensor_optimizer.hpp"
#include "optimizer_test_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace adamw_test {

using namespace optimizer_testing;

Rig make(const std::string& config, std::uint64_t seed = 1) { return make_rig("adamw", config, seed); }

TEST(AdamWOptimizer, OneStepMatchesTheHandComputation) {
  const double lr = 0.01, wd = 0.5, eps = 1e-6;
  Rig s = make("lr: 0.01, weight_decay: 0.5, beta1: 0.8, beta2: 0.95, eps: 1e-6");
  EXPECT_DOUBLE_EQ(s.optimizer->base_lr(), lr);
  const auto before = snapshot(*s.model);
  set_gradients(s.model->parameters(), 0);
  s.optimizer->step();
  const auto params = s.model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    // Step 1: bias-corrected moments are g and g^2; decoupled decay only on >= 2-D tensors.
    const at::Tensor p0 = before[i].to(at::kDouble);
    const at::Tensor g = gradient_for(before[i], 0).to(at::kDouble);
    const double decay = before[i].dim() >= 2 ? wd : 0.0;
    const at::Tensor expected = p0 * (1 - lr * decay) - lr * g / (g.abs() + eps);
    EXPECT_LE((params[i].detach().to(at::kDouble) - expected).abs().max().item<double>(), 3e-7) << "parameter " << i;
  }
}

// Every implementation against torch::optim::AdamW with the same decay groups: loop and foreach
// run its arithmetic (bit for bit), fused LibTorch's one kernel (equal within float rounding).
TEST(AdamWOptimizer, EveryImplementationEqualsTorchAdamWWithTheSameGroups) {
 for (const std::string implementation : {"loop", "foreach", "fused", "auto"}) {
  SCOPED_TRACE(implementation);
  Rig s = make("lr: 0.02, weight_decay: 0.1, beta1: 0.8, beta2: 0.95, eps: 1e-6, implementation: " + implementation);
  // The reference: torch::optim::AdamW on clones, 2-D tensors decayed, the rest not.
  std::vector<at::Tensor> reference, decayed, undecayed;
  for (const auto& p : s.model->parameters()) {
    reference.push_back(p.detach().clone().requires_grad_(true));
    (p.dim() >= 2 ? decayed : undecayed).push_back(reference.back());
  }
  ASSERT_FALSE(decayed.empty());
  ASSERT_FALSE(undecayed.empty());
  auto options = torch::optim::AdamWOptions(0.02).betas(std::make_tuple(0.8, 0.95)).eps(1e-6).weight_decay(0.1);
  auto no_decay = options;
  no_decay.weight_decay(0.0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(undecayed, std::make_unique<torch::optim::AdamWOptions>(no_decay));
  torch::optim::AdamW torch_adamw(groups, options);

  for (int k = 0; k < 3; ++k) {
    set_gradients(s.model->parameters(), k);
    s.optimizer->step();
    s.optimizer->zero_grad();
    set_gradients(reference, k);
    torch_adamw.step();
  }
  if (implementation == "loop" || implementation == "foreach") {
    EXPECT_TRUE(all_equal(snapshot(*s.model), reference));
  } else {
    const auto mine = snapshot(*s.model);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      EXPECT_TRUE(mine[i].allclose(reference[i], /*rtol=*/1e-5, /*atol=*/1e-7))
          << "parameter " << i << " differs by " << (mine[i] - reference[i]).abs().max().item<double>();
    }
  }
 }
}

// The state dict is the same whichever implementation wrote it: a run saved under fused resumes
// under loop and foreach where fused itself would be (within float rounding), and state_bytes()
// counts the moments without copying them.
TEST(AdamWOptimizer, StateMovesBetweenImplementations) {
  Rig fused = make("lr: 0.02, weight_decay: 0.1, implementation: fused");
  run_steps(fused, 0, 2);
  const StateDict state = fused.optimizer->state_dict();
  const auto weights = snapshot(*fused.model);
  std::int64_t moments = 0;
  for (const auto& p : fused.model->parameters()) moments += 2 * p.numel() * 4;
  EXPECT_GE(fused.optimizer->state_bytes(), moments);
  EXPECT_LE(fused.optimizer->state_bytes(), moments + 4 * static_cast<std::int64_t>(weights.size()));
  run_steps(fused, 2, 4);
  for (const std::string implementation : {"loop", "foreach"}) {
    Rig other = make("lr: 0.02, weight_decay: 0.1, implementation: " + implementation, 7);
    copy_weights(*other.model, weights);
    other.optimizer->load_state_dict(state);
    run_steps(other, 2, 4);
    const auto a = snapshot(*other.model), b = snapshot(*fused.model);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].allclose(b[i], 1e-5, 1e-7)) << implementation << " " << i;
  }
}


TEST(AdamWOptimizer, NormsAndBiasesAreNotDecayedByDefault) {
  for (bool decay_all : {false, true}) {
    Rig s = make(std::string("lr: 0.1, weight_decay: 0.5, decay_norm_and_bias: ") + (decay_all ? "true" : "false"));
    const auto before = snapshot(*s.model);
    // A zero gradient moves nothing: only the weight decay acts.
    for (const auto& p : s.model->parameters()) p.mutable_grad() = at::zeros_like(p);
    s.optimizer->step();
    const auto after = snapshot(*s.model);
    int one_d = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      const bool decayed = decay_all || before[i].dim() >= 2;
      const at::Tensor expected = decayed ? before[i] * 0.95 : before[i];
      EXPECT_TRUE(at::allclose(after[i], expected, 1e-6, 1e-9)) << "parameter " << i << " decay_all " << decay_all;
      if (before[i].dim() < 2) {
        ++one_d;
        if (!decayed) EXPECT_TRUE(after[i].equal(before[i])) << "parameter " << i;
      }
    }
    EXPECT_GT(one_d, 0);
    // LayerNorm weights start at 1: decayed they are 0.95.
    const at::Tensor ln = s.model->named_parameters()["ln_f.weight"].detach();
    EXPECT_NEAR(ln[0].item<double>(), decay_all ? 0.95 : 1.0, 1e-6);
  }
}

// A block registered under two names (shared layers) is listed twice by Module::parameters():
// the optimizer still holds each parameter once and steps it once, as a model without the second
// name would be stepped.
TEST(AdamWOptimizer, AParameterTheModelHoldsTwiceIsOptimisedOnce) {
  Rig shared = make("lr: 0.01");
  Rig plain = make("lr: 0.01");
  const std::size_t unique = shared.model->parameters().size();
  const auto first_block = shared.model->named_children().begin()->value();
  shared.model->register_module("same_block_again", first_block);
  ASSERT_GT(shared.model->parameters().size(), unique) << "the model now lists some parameters twice";

  const ComponentInfo* adamw = testing::bundled_plugins().registry().find("optimizer", "adamw");
  ASSERT_NE(adamw, nullptr);
  std::map<std::string, Value> values;
  for (const FieldSpec& field : adamw->schema.fields()) values[field.name] = field.default_value;
  values["lr"] = 0.01;
  values["model"] = ComponentHandle{"model", "gpt", shared.model};
  auto optimizer = std::static_pointer_cast<Optimizer>(adamw->make(ComponentConfig("components.optimizer.config", values, {})));
  EXPECT_EQ(optimizer->parameters().size(), unique);

  set_gradients(shared.model->parameters(), 0);
  optimizer->step();
  run_steps(plain, 0, 1);
  const auto stepped = shared.model->named_parameters();
  for (const auto& expected : plain.model->named_parameters()) {
    EXPECT_TRUE(stepped[expected.key()].equal(expected.value())) << expected.key() << " moved otherwise than one step moves it";
  }
}

TEST(AdamWOptimizer, SetLrTakesEffectOnEveryGroup) {
  Rig changed = make("lr: 0.01, weight_decay: 0.1");
  Rig direct = make("lr: 0.003, weight_decay: 0.1");
  ASSERT_TRUE(all_equal(snapshot(*changed.model), snapshot(*direct.model)));
  changed.optimizer->set_lr(0.003);
  run_steps(changed, 0, 2);
  run_steps(direct, 0, 2);
  EXPECT_TRUE(all_equal(snapshot(*changed.model), snapshot(*direct.model)));
  EXPECT_DOUBLE_EQ(changed.optimizer->base_lr(), 0.01) << "set_lr does not change the base lr";
}

TEST(AdamWOptimizer, ZeroGradClearsGradients) {
  Rig s = make("lr: 0.01");
  set_gradients(s.model->parameters(), 0);
  s.optimizer->zero_grad();
  for (const auto& p : s.optimizer->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(AdamWOptimizer, StateDictRoundTripContinuesBitForBit) {
  for (const std::string implementation : {"loop", "foreach", "fused"}) {
    SCOPED_TRACE(implementation);
    expect_exact_resume("adamw", "lr: 0.01, weight_decay: 0.1, implementation: " + implementation);
  }
  const std::string config = "lr: 0.01, weight_decay: 0.1, beta1: 0.8, beta2: 0.95";
  EXPECT_TRUE(make(config).optimizer->state_dict().empty()) << "no state before the first step";
  const StateDict state = expect_exact_resume("adamw", config);
  EXPECT_EQ(state.size(), 3 * make(config).optimizer->parameters().size());
  EXPECT_EQ(state.at("param.0.step").item<std::int64_t>(), 2);
}

void expect_same_state(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, t] : a) EXPECT_TRUE(t.equal(b.at(key))) << key;
}

// The trainer's non-finite guard hands fused AdamW the flag as a device scalar instead of waiting
// for it (Optimizer::skip_next_step_if): a flagged step changes no bit of the weights or the
// state, the step count included; an unflagged one is the plain step; the flag lasts one step.
TEST(AdamWOptimizer, FusedSkipsAFlaggedStepOnTheDevice) {
  EXPECT_FALSE(make("lr: 0.01, implementation: foreach").optimizer->can_skip_on_device());
  EXPECT_FALSE(make("lr: 0.01, implementation: loop").optimizer->can_skip_on_device());
  EXPECT_TRUE(make("lr: 0.01").optimizer->can_skip_on_device()) << "auto is fused on the CPU";

  const std::string config = "lr: 0.02, weight_decay: 0.1, implementation: fused";
  const at::Tensor skip = at::ones({}, at::kFloat), go = at::zeros({}, at::kFloat);
  Rig flagged = make(config), plain = make(config);
  // A skipped first step leaves no state: as if the step had never been asked for.
  set_gradients(flagged.model->parameters(), 0);
  const auto initial = snapshot(*flagged.model);
  flagged.optimizer->skip_next_step_if(skip);
  flagged.optimizer->step();
  EXPECT_TRUE(all_equal(snapshot(*flagged.model), initial));
  EXPECT_TRUE(flagged.optimizer->state_dict().empty());

  run_steps(flagged, 0, 2);
  run_steps(plain, 0, 2);
  const auto weights = snapshot(*flagged.model);
  const StateDict state = flagged.optimizer->state_dict();
  EXPECT_EQ(state.at("param.0.step").item<std::int64_t>(), 2);
  set_gradients(flagged.model->parameters(), 2);
  flagged.optimizer->skip_next_step_if(skip);
  flagged.optimizer->step();
  EXPECT_TRUE(all_equal(snapshot(*flagged.model), weights));
  expect_same_state(flagged.optimizer->state_dict(), state);

  // Unflagged, and then with no flag at all (it lasted one step): the plain steps, bit for bit.
  set_gradients(flagged.model->parameters(), 2);
  flagged.optimizer->skip_next_step_if(go);
  flagged.optimizer->step();
  run_steps(flagged, 3, 4);
  run_steps(plain, 2, 4);
  EXPECT_TRUE(all_equal(snapshot(*flagged.model), snapshot(*plain.model)));
  expect_same_state(flagged.optimizer->state_dict(), plain.optimizer->state_dict());
}

TEST(AdamWOptimizer, RejectsForeignState) {
  Rig s = make("lr: 0.01");
  run_steps(s, 0, 1);
  StateDict state = s.optimizer->state_dict();
  StateDict extra = state;
  extra["param.0.momentum_buffer"] = at::zeros({1});
  EXPECT_THROW(s.optimizer->load_state_dict(extra), Error);
  StateDict wrong_shape = state;
  wrong_shape["param.0.exp_avg"] = at::zeros({3, 3, 3});
  EXPECT_THROW(s.optimizer->load_state_dict(wrong_shape), Error);
  StateDict missing = state;
  missing.erase("param.0.exp_avg_sq");
  EXPECT_THROW(s.optimizer->load_state_dict(missing), Error);
}

// Parameters of two dtypes in one group: fused runs a kernel per device and dtype (on CUDA one
// call over both would be refused), ending where the loop does.
TEST(AdamWOptimizer, FusedStepsParametersOfSeveralDtypesAsTheLoopDoes) {
  expect_fused_steps_several_dtypes_as_the_loop("adamw", "lr: 0.01, weight_decay: 0.1", c10::Device(c10::kCPU));
}

TEST(AdamWOptimizer, FusedStepsParametersOfSeveralDtypesOnCuda) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA GPU on this machine: this test runs on a GPU machine only";
  expect_fused_steps_several_dtypes_as_the_loop("adamw", "lr: 0.01, weight_decay: 0.1", c10::Device(c10::kCUDA, 0));
}

TEST(MultiTensorOptimizer, SplitsIndicesByDeviceAndDtypeKeepingTheirOrder) {
  const std::vector<at::Tensor> params = {at::zeros({2}), at::zeros({2}, at::kDouble), at::zeros({3}),
                                          at::zeros({1}, at::kBFloat16), at::zeros({1}, at::kDouble)};
  using Splits = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(tessera_plugins::split_by_device_and_dtype(params, {0, 1, 2, 3, 4}), (Splits{{0, 2}, {1, 4}, {3}}));
  EXPECT_EQ(tessera_plugins::split_by_device_and_dtype(params, {4, 2, 1}), (Splits{{4, 1}, {2}}));
  EXPECT_EQ(tessera_plugins::split_by_device_and_dtype(params, {0, 2}), (Splits{{0, 2}}));
  EXPECT_TRUE(tessera_plugins::split_by_device_and_dtype(params, {}).empty());
}

}  // namespace adamw_test
}  // namespace tessera
