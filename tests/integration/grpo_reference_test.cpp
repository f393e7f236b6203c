// GRPO's pieces against TRL's own lines (tools/interop/grpo_reference.py, trl==1.16.0): the group
// advantages of weighted rewards with None among them, for every scale_rewards, over random
// groups (ties, a constant group, an unscorable completion, a group of one scorable completion).
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

#include "reference_process.hpp"
#include "tessera/generation/group_advantages.hpp"
#include "test_support.hpp"

namespace tessera {
namespace grpo_reference_test {

using nlohmann::json;

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
      c["weights"] = {1.0, 0.5};
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
  testing::TempDir dir;
  std::ofstream(dir.file("cases.json")) << cases.dump();
  std::string out;
  ASSERT_EQ(testing::run_command(python + " " + testing::source_dir() + "/tools/interop/grpo_reference.py advantages " +
                                     dir.file("cases.json") + " " + dir.file("expected.json"),
                                 out),
            0)
      << out;
  std::ifstream in(dir.file("expected.json"));
  const json expected = json::parse(in);
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

}  // namespace grpo_reference_test
}  // namespace tessera
