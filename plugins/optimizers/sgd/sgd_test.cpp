// optimizer/sgd built through the real loader and factory on a tiny gpt: plain, momentum, weight
// decay and Nesterov updates against hand computations and torch::optim::SGD, set_lr, and a
// state-dict round trip that continues bit for bit.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <string>
#include <vector>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"
#include "optimizer_test_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace sgd_test {

using namespace optimizer_testing;

Rig make(const std::string& config, std::uint64_t seed = 1) { return make_rig("sgd", config, seed); }

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(SgdOptimizer, PlainStepIsLrTimesGradient) {
  Rig s = make("lr: 0.5");
  EXPECT_DOUBLE_EQ(s.optimizer->base_lr(), 0.5);
  const auto before = snapshot(*s.model);
  set_gradients(s.model->parameters(), 0);
  s.optimizer->step();
  const auto params = s.model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor expected = before[i].to(at::kDouble) - 0.5 * gradient_for(before[i], 0).to(at::kDouble);
    EXPECT_LE(max_diff(params[i].detach(), expected), 1e-6) << "parameter " << i;
  }
  EXPECT_TRUE(s.optimizer->state_dict().empty()) << "plain SGD has no state";
}

TEST(SgdOptimizer, MomentumAndWeightDecayMatchTheHandComputation) {
  const double lr = 0.1, m = 0.9, wd = 0.2;
  Rig s = make("lr: 0.1, momentum: 0.9, weight_decay: 0.2");
  const auto p0 = snapshot(*s.model);
  run_steps(s, 0, 1);
  const auto p1 = snapshot(*s.model);
  run_steps(s, 1, 2);
  const auto p2 = snapshot(*s.model);
  for (size_t i = 0; i < p0.size(); ++i) {
    // L2 decay joins the gradient; the first buffer is the gradient itself.
    const at::Tensor a0 = p0[i].to(at::kDouble);
    const at::Tensor d1 = gradient_for(p0[i], 0).to(at::kDouble) + wd * a0;
    const at::Tensor e1 = a0 - lr * d1;
    EXPECT_LE(max_diff(p1[i], e1), 1e-6) << "step 1, parameter " << i;
    const at::Tensor d2 = gradient_for(p1[i], 1).to(at::kDouble) + wd * p1[i].to(at::kDouble);
    const at::Tensor buf2 = m * d1 + d2;
    const at::Tensor e2 = p1[i].to(at::kDouble) - lr * buf2;
    EXPECT_LE(max_diff(p2[i], e2), 1e-6) << "step 2, parameter " << i;
  }
}

// Every implementation against torch::optim::SGD: loop and foreach run its arithmetic (bit for
// bit), fused LibTorch's one kernel (equal within float rounding); momentum with and without
// Nesterov, with weight decay.
TEST(SgdOptimizer, EveryImplementationEqualsTorchSgd) {
  for (const bool nesterov : {true, false}) {
    for (const std::string implementation : {"loop", "foreach", "fused", "auto"}) {
      SCOPED_TRACE(implementation + (nesterov ? " nesterov" : " heavy ball"));
      Rig s = make(std::string("lr: 0.05, momentum: 0.8, weight_decay: 0.01, nesterov: ") +
                   (nesterov ? "true" : "false") + ", implementation: " + implementation);
      std::vector<at::Tensor> reference;
      for (const auto& p : s.model->parameters()) reference.push_back(p.detach().clone().requires_grad_(true));
      torch::optim::SGD torch_sgd(reference,
                                  torch::optim::SGDOptions(0.05).momentum(0.8).nesterov(nesterov).weight_decay(0.01));
      for (int k = 0; k < 3; ++k) {
        run_steps(s, k, k + 1);
        set_gradients(reference, k);
        torch_sgd.step();
      }
      const auto mine = snapshot(*s.model);
      if (implementation == "loop" || implementation == "foreach") {
        EXPECT_TRUE(all_equal(mine, reference));
      } else {
        for (std::size_t i = 0; i < mine.size(); ++i) {
          EXPECT_TRUE(mine[i].allclose(reference[i], 1e-5, 1e-7)) << "parameter " << i;
        }
      }
    }
  }
  // And Nesterov is not plain momentum.
  Rig heavy_ball = make("lr: 0.05, momentum: 0.8, weight_decay: 0.01");
  Rig nesterov = make("lr: 0.05, momentum: 0.8, nesterov: true, weight_decay: 0.01");
  run_steps(heavy_ball, 0, 3);
  run_steps(nesterov, 0, 3);
  EXPECT_FALSE(all_equal(snapshot(*heavy_ball.model), snapshot(*nesterov.model)));
}

// A parameter without a gradient in the first step (unused so far) starts its momentum buffer at
// its own first gradient, as torch's SGD decides per parameter, while the others' buffers keep
// their history; the first parameter is the late one, the case a group-wide decision gets wrong.
TEST(SgdOptimizer, AParameterWithALaterFirstGradientStartsItsOwnMomentum) {
  for (const std::string implementation : {"loop", "foreach", "fused"}) {
    SCOPED_TRACE(implementation);
    Rig s = make("lr: 0.05, momentum: 0.8, implementation: " + implementation);
    std::vector<at::Tensor> reference;
    for (const auto& p : s.model->parameters()) reference.push_back(p.detach().clone().requires_grad_(true));
    torch::optim::SGD torch_sgd(reference, torch::optim::SGDOptions(0.05).momentum(0.8));
    const std::vector<at::Tensor> params = s.model->parameters();
    for (int k = 0; k < 3; ++k) {
      set_gradients(params, k);
      set_gradients(reference, k);
      if (k == 0) {
        params[0].mutable_grad() = at::Tensor();
        reference[0].mutable_grad() = at::Tensor();
      }
      s.optimizer->step();
      s.optimizer->zero_grad();
      torch_sgd.step();
    }
    const auto mine = snapshot(*s.model);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      if (implementation == "fused") {
        EXPECT_TRUE(mine[i].allclose(reference[i], 1e-5, 1e-7)) << "parameter " << i;
      } else {
        EXPECT_TRUE(mine[i].equal(reference[i])) << "parameter " << i << ", max difference " << max_diff(mine[i], reference[i]);
      }
    }
  }
}

TEST(SgdOptimizer, NesterovWithoutMomentumIsAConfigIssue) {
  try {
    make("lr: 0.1, nesterov: true");
    FAIL() << "expected a ConfigIssue";
  } catch (const core::ConfigIssue& e) {
    EXPECT_EQ(e.path(), "components.optimizer.config.nesterov");
    EXPECT_NE(e.message().find("nesterov needs momentum > 0"), std::string::npos) << e.what();
  }
}

TEST(SgdOptimizer, SetLrTakesEffect) {
  Rig changed = make("lr: 1.0, momentum: 0.5");
  Rig direct = make("lr: 0.25, momentum: 0.5");
  changed.optimizer->set_lr(0.25);
  run_steps(changed, 0, 2);
  run_steps(direct, 0, 2);
  EXPECT_TRUE(all_equal(snapshot(*changed.model), snapshot(*direct.model)));
  EXPECT_DOUBLE_EQ(changed.optimizer->base_lr(), 1.0);
}

TEST(SgdOptimizer, StateDictRoundTripContinuesBitForBit) {
  for (const std::string implementation : {"loop", "foreach", "fused"}) {
    SCOPED_TRACE(implementation);
    expect_exact_resume("sgd", "lr: 0.1, momentum: 0.9, implementation: " + implementation);
  }
  const std::string config = "lr: 0.1, momentum: 0.9";
  const StateDict state = expect_exact_resume("sgd", config);
  EXPECT_EQ(state.size(), make(config).optimizer->parameters().size());
  EXPECT_EQ(state.count("param.0.momentum_buffer"), 1u);
}

TEST(SgdOptimizer, RejectsForeignState) {
  Rig s = make("lr: 0.1, momentum: 0.9");
  run_steps(s, 0, 1);
  StateDict state = s.optimizer->state_dict();
  StateDict extra = state;
  extra["param.0.exp_avg"] = at::zeros({1});
  EXPECT_THROW(s.optimizer->load_state_dict(extra), Error);
  StateDict wrong_shape = state;
  wrong_shape["param.0.momentum_buffer"] = at::zeros({3, 3, 3});
  EXPECT_THROW(s.optimizer->load_state_dict(wrong_shape), Error);
}

// Parameters of two dtypes in one group: fused runs a kernel per device and dtype (on CUDA one
// call over both would be refused), ending where the loop does.
TEST(SgdOptimizer, FusedStepsParametersOfSeveralDtypesAsTheLoopDoes) {
  expect_fused_steps_several_dtypes_as_the_loop("sgd", "lr: 0.05, momentum: 0.8, weight_decay: 0.01", c10::Device(c10::kCPU));
}

TEST(SgdOptimizer, FusedStepsParametersOfSeveralDtypesOnCuda) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA GPU on this machine: this test runs on a GPU machine only";
  expect_fused_steps_several_dtypes_as_the_loop("sgd", "lr: 0.05, momentum: 0.8, weight_decay: 0.01", c10::Device(c10::kCUDA, 0));
}

}  // namespace sgd_test
}  // namespace tessera
