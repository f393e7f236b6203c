// Test helpers shared by the optimizer plugins' tests (header only, tests/support):
// a tiny gpt and the optimizer under test built through the real loader and factory, gradients
// that depend on the weights and the step, and weight snapshots to compare runs bit for bit.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/core/run/training_run.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"
#include "test_support.hpp"

namespace tessera::optimizer_testing {

struct Rig {
  core::BuiltComponents components;
  std::shared_ptr<Model> model;
  std::shared_ptr<Optimizer> optimizer;
};

inline const char* kModel =
    "model: {component_key: model, variant_key: gpt, config: {vocab_size: 16, n_layer: 1, n_head: 2, n_embd: 8, max_seq_len: 4}}\n";

// Seeds, then builds the tiny gpt and optimizer/VARIANT with `config` (without the model field).
inline Rig make_rig(const std::string& variant, const std::string& config, std::uint64_t seed) {
  core::seed_everything(seed, "cpu");
  Rig s;
  s.components = testing::build_components(
      std::string(kModel) + "optimizer: {component_key: optimizer, variant_key: " + variant + ", config: {" + config +
      ", model: {instance_key: model}}}\n");
  s.model = testing::built<Model>(s.components, "model");
  s.optimizer = testing::built<Optimizer>(s.components, "optimizer");
  return s;
}

// A gradient that depends on the parameter's current value and on the step, so any divergence
// between two runs shows up in later steps.
inline at::Tensor gradient_for(const at::Tensor& p, int step) { return at::sin(p.detach() * 3.0 + (step + 1)); }

inline void set_gradients(const std::vector<at::Tensor>& params, int step) {
  for (const auto& p : params) p.mutable_grad() = gradient_for(p, step);
}

inline void run_steps(Rig& s, int from, int to) {
  for (int k = from; k < to; ++k) {
    set_gradients(s.model->parameters(), k);
    s.optimizer->step();
    s.optimizer->zero_grad();
  }
}

inline std::vector<at::Tensor> snapshot(const Model& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

inline void copy_weights(Model& model, const std::vector<at::Tensor>& weights) {
  c10::NoGradGuard no_grad;
  auto params = model.parameters();
  ASSERT_EQ(params.size(), weights.size());
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(weights[i]);
}

inline bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equal(b[i])) return false;
  }
  return true;
}

// The resume contract every optimizer keeps: the state after 2 of 5 steps is a copy (a later
// step does not change it), and a freshly built optimizer on another init, given the saved
// weights and state, ends bit for bit where the uninterrupted run does, while the same weights
// without the state do not. Returns the saved state for per-optimizer key checks.
inline StateDict expect_exact_resume(const std::string& variant, const std::string& config) {
  Rig uninterrupted = make_rig(variant, config, 1);
  run_steps(uninterrupted, 0, 5);

  Rig first = make_rig(variant, config, 1);
  run_steps(first, 0, 2);
  const StateDict state = first.optimizer->state_dict();
  StateDict saved;
  for (const auto& [key, value] : state) saved[key] = value.clone();
  const auto weights = snapshot(*first.model);
  run_steps(first, 2, 3);
  for (const auto& [key, value] : state) EXPECT_TRUE(value.equal(saved.at(key))) << key << " is not a copy";

  Rig resumed = make_rig(variant, config, 99);
  copy_weights(*resumed.model, weights);
  resumed.optimizer->load_state_dict(state);
  run_steps(resumed, 2, 5);
  EXPECT_TRUE(all_equal(snapshot(*resumed.model), snapshot(*uninterrupted.model)));

  Rig without_state = make_rig(variant, config, 99);
  copy_weights(*without_state.model, weights);
  run_steps(without_state, 2, 5);
  EXPECT_FALSE(all_equal(snapshot(*without_state.model), snapshot(*uninterrupted.model)));
  return state;
}

// Whether this machine has a CUDA device (the CUDA cases skip without one, saying so).
inline bool have_cuda_device() { return at::hasCUDA(); }

// `config` on the tiny gpt with every other parameter in float64 and all of them on `device`: the
// fused implementation (one kernel per device and dtype, which LibTorch's CUDA kernels require)
// ends where the loop does within float rounding, each parameter keeping its dtype.
inline void expect_fused_steps_several_dtypes_as_the_loop(const std::string& variant, const std::string& config,
                                                         const c10::Device& device) {
  std::vector<std::vector<at::Tensor>> ends;
  for (const std::string implementation : {"fused", "loop"}) {
    Rig s = make_rig(variant, config + ", implementation: " + implementation, 1);
    const std::vector<at::Tensor> params = s.model->parameters();
    {
      c10::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params.size(); ++i) {
        params[i].set_data(params[i].detach().to(device, i % 2 == 1 ? at::kDouble : at::kFloat));
      }
    }
    run_steps(s, 0, 3);
    ends.push_back(snapshot(*s.model));
  }
  const std::vector<at::Tensor>& fused = ends[0];
  const std::vector<at::Tensor>& loop = ends[1];
  ASSERT_EQ(fused.size(), loop.size());
  ASSERT_GE(fused.size(), 2u);
  for (std::size_t i = 0; i < fused.size(); ++i) {
    EXPECT_EQ(fused[i].scalar_type(), i % 2 == 1 ? at::kDouble : at::kFloat) << "parameter " << i;
    EXPECT_EQ(fused[i].device(), device) << "parameter " << i;
    EXPECT_TRUE(fused[i].allclose(loop[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

}  // namespace tessera::optimizer_testing
