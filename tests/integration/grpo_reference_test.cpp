// GRPO's pieces against TRL's own lines (tools/interop/grpo_reference.py, trl==1.16.0): the group
// advantages of weighted rewards with None among them, for every scale_rewards, over random
// groups (ties, a constant group, an unscorable completion, a group of one scorable completion);
// the objective of every loss_type, token and sequence importance sampling, with and without the
// KL term and delta, its gradient and its clip and KL metrics.
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "grpo_objective.hpp"
#include "reference_process.hpp"
#include "tessera/generation/group_advantages.hpp"
#include "test_support.hpp"

namespace tessera {
namespace grpo_reference_test {

using nlohmann::json;

// grpo_reference.py MODE over `cases`: its answers, one per case (empty, the test failed, when it
// did not run).
json reference(const std::string& python, const std::string& mode, const json& cases) {
  testing::TempDir dir;
  std::ofstream(dir.file("cases.json")) << cases.dump();
  std::string out;
  const int rc = testing::run_command(python + " " + testing::source_dir() + "/tools/interop/grpo_reference.py " + mode +
                                          " " + dir.file("cases.json") + " " + dir.file("expected.json"),
                                      out);
  EXPECT_EQ(rc, 0) << out;
  if (rc != 0) return json::array();
  std::ifstream in(dir.file("expected.json"));
  return json::parse(in);
}

TEST(GrpoReference, GroupAdvantagesEqualTrlsForEveryScaling) {
  const std::string python = testing::source_dir() + "/.venv/bin/python3";
  if (!testing::python_has(python, {"trl", "torch"})) GTEST_SKIP() << "trl is not installed in .venv (tools/setup.sh installs it)";
  std::mt19937 draw(7);
  std::uniform_int_distribution<int> coin(0, 5), score(0, 3);
  json cases = json::array();
  for (const std::string scale : {"group", "batch", "none"}) {
    for (const std::int64_t generations : {1, 2, 4}) {
      json c;
      c["scale_rewards"] = scale;
      c["num_generations"] = generations;
      c["weights"] = {1.0, 0.3};  // 0.3 is not exact in float32, as TRL holds it
      json rows = json::array();
      for (std::int64_t i = 0; i < 3 * generations; ++i) {
        // A verifier's 0/1 (none for one in six) and a graded score.
        const json first = coin(draw) == 0 ? json(nullptr) : json(static_cast<double>(score(draw) % 2));
        rows.push_back({first, 0.25 * score(draw)});
      }
      if (generations > 1) {
        rows[0] = {nullptr, nullptr};  // unscorable: no reward applied
        rows[generations] = {1.0, 0.5};  // a constant group: zero std
        for (std::int64_t k = 1; k < generations; ++k) rows[generations + k] = {1.0, 0.5};
      }
      c["scores"] = rows;
      cases.push_back(c);
    }
  }
  const json expected = reference(python, "advantages", cases);
  ASSERT_EQ(expected.size(), cases.size());
  const auto nan_or = [](const json& v) {
    return v.is_null() ? std::numeric_limits<float>::quiet_NaN() : v.get<float>();
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    SCOPED_TRACE(c["scale_rewards"].get<std::string>() + ", groups of " + std::to_string(c["num_generations"].get<int>()));
    std::vector<float> flat;
    for (const auto& row : c["scores"]) {
      for (const auto& v : row) flat.push_back(nan_or(v));
    }
    const at::Tensor scores = at::tensor(flat, at::kFloat).view({-1, 2});
    const GroupAdvantages got = group_advantages(scores, c["weights"].get<std::vector<double>>(),
                                                 c["num_generations"].get<std::int64_t>(),
                                                 c["scale_rewards"].get<std::string>());
    const auto n = static_cast<std::int64_t>(c["scores"].size());
    for (std::int64_t k = 0; k < n; ++k) {
      const json& want = expected[i];
      const float reward = got.rewards[k].item<float>(), want_reward = nan_or(want["rewards"][k]);
      EXPECT_EQ(std::isnan(reward), std::isnan(want_reward)) << "completion " << k;
      if (!std::isnan(want_reward)) EXPECT_NEAR(reward, want_reward, 1e-6) << "completion " << k;
      EXPECT_NEAR(got.advantages[k].item<float>(), nan_or(want["advantages"][k]), 1e-5) << "completion " << k;
      EXPECT_EQ(got.zero_std[k].item<bool>(), want["zero_std"][k].get<bool>()) << "completion " << k;
    }
  }
  EXPECT_THROW(group_advantages(at::zeros({3, 1}), {1.0}, 2, "group"), Error) << "3 completions in groups of 2";
  EXPECT_THROW(group_advantages(at::zeros({2, 1}), {1.0}, 2, "groups"), Error);
}

std::vector<double> flat(const json& rows) {
  std::vector<double> out;
  for (const auto& row : rows) {
    for (const auto& v : row) out.push_back(v.get<double>());
  }
  return out;
}

TEST(GrpoReference, ObjectiveLossGradientAndMetricsEqualTrlsForEveryLossType) {
  const std::string python = testing::source_dir() + "/.venv/bin/python3";
  if (!testing::python_has(python, {"trl", "torch"})) GTEST_SKIP() << "trl is not installed in .venv (tools/setup.sh installs it)";
  std::mt19937 draw(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::int64_t rows = 4, length = 5;
  json cases = json::array();
  for (const std::string loss_type : {"grpo", "bnpo", "dr_grpo", "dapo"}) {
    for (const std::string level : {"token", "sequence"}) {
      for (const double beta : {0.0, 0.04}) {
        for (const int variant : {0, 1, 2}) {  // on-policy; sampled earlier; sampled earlier with delta 1.1
          const bool with_old = variant > 0;
          json c;
          c["loss_type"] = loss_type;
          c["importance_sampling_level"] = level;
          c["beta"] = beta;
          c["epsilon"] = 0.2;
          c["epsilon_high"] = 0.28;
          // delta at 1.1, inside the clip range's top (1.28): it caps weights coef_2 would have clipped.
          c["delta"] = variant == 2 ? json(1.1) : json(nullptr);
          c["use_bias_correction_kl"] = variant != 1;
          c["max_completion_length"] = 8;
          json logps = json::array(), old = json::array(), ref = json::array(), mask = json::array();
          for (std::int64_t b = 0; b < rows; ++b) {
            json l = json::array(), o = json::array(), r = json::array(), m = json::array();
            for (std::int64_t t = 0; t < length; ++t) {
              const double lp = -1.5 + 0.5 * normal(draw);
              l.push_back(lp);
              o.push_back(lp + 0.4 * normal(draw));  // ratios well outside [0.8, 1.28]: the clip is active
              r.push_back(lp + 0.3 * normal(draw));
              // completions of 5, 4 and 3 tokens, and one masked whole (mask_truncated_completions)
              m.push_back(b < 3 && t < length - b ? 1.0 : 0.0);
            }
            logps.push_back(l), old.push_back(o), ref.push_back(r), mask.push_back(m);
          }
          c["logps"] = logps;
          c["old_logps"] = with_old ? old : json(nullptr);
          c["ref_logps"] = beta != 0.0 ? ref : json(nullptr);
          c["mask"] = mask;
          c["advantages"] = {1.2, -0.7, 0.0, -1.5};
          cases.push_back(c);
        }
      }
    }
  }
  const json expected = reference(python, "objective", cases);
  ASSERT_EQ(expected.size(), cases.size());
  const auto tensor = [&](const json& v) {
    return v.is_null() ? at::Tensor() : at::tensor(flat(v), at::kDouble).view({rows, length});
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    SCOPED_TRACE(c.dump().substr(0, 160));
    tessera_plugins::grpo::ObjectiveSettings s;
    s.loss_type = c["loss_type"];
    s.importance_sampling_level = c["importance_sampling_level"];
    s.epsilon_low = c["epsilon"];
    s.epsilon_high = c["epsilon_high"];
    if (!c["delta"].is_null()) s.delta = c["delta"].get<double>();
    s.beta = c["beta"];
    s.use_bias_correction_kl = c["use_bias_correction_kl"];
    ASSERT_EQ(expected[i]["use_bias_correction_kl"].get<bool>(), s.use_bias_correction_kl);
    s.max_completion_length = c["max_completion_length"];
    const at::Tensor logps = tensor(c["logps"]).requires_grad_(true), mask = tensor(c["mask"]);
    const auto terms = tessera_plugins::grpo::objective_terms(
        logps, tensor(c["old_logps"]), tensor(c["ref_logps"]),
        at::tensor(c["advantages"].get<std::vector<double>>(), at::kDouble), mask, s);
    const auto sum = tessera_plugins::grpo::aggregate(terms.per_token_loss, mask, s);
    // One micro-batch of one rank: the step's loss is its sum over its units.
    const at::Tensor loss = sum.sum / sum.units;
    loss.backward();
    const json& want = expected[i];
    EXPECT_NEAR(loss.item<double>(), want["loss"].get<double>(), 1e-12);
    const auto grad = flat(want["grad"]);
    for (std::int64_t k = 0; k < rows * length; ++k) {
      EXPECT_NEAR(logps.grad().view(-1)[k].item<double>(), grad[static_cast<std::size_t>(k)], 1e-12) << "token " << k;
    }
    const auto masked_mean = [&](const at::Tensor& x) {
      const at::Tensor v = x.to(at::kDouble);
      return v.size(1) == 1 ? v.sum().item<double>() / static_cast<double>(v.size(0))
                            : ((v * mask).sum() / mask.sum()).item<double>();
    };
    EXPECT_NEAR(masked_mean(terms.low_clipped), want["low_clip"].get<double>(), 1e-12);
    EXPECT_NEAR(masked_mean(terms.high_clipped), want["high_clip"].get<double>(), 1e-12);
    if (s.beta != 0.0) EXPECT_NEAR(masked_mean(terms.per_token_kl.detach()), want["kl"].get<double>(), 1e-12);
  }
  for (const std::string level : {"token", "sequence"}) {
    double clipped = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      if (cases[i]["importance_sampling_level"] == level) {
        clipped += expected[i]["low_clip"].get<double>() + expected[i]["high_clip"].get<double>();
      }
    }
    EXPECT_GT(clipped, 0.0) << "the " << level << "-level cases must exercise the clip";
  }
}

}  // namespace grpo_reference_test
}  // namespace tessera
