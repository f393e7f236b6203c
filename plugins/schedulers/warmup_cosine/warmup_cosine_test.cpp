// scheduler/warmup_cosine built through the real loader and factory: exact factors in warmup,
// along the half cosine, at and past total_steps, and the config it rejects.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/components/scheduler.hpp"
#include "test_support.hpp"

namespace tessera {
namespace warmup_cosine_test {

constexpr double kPi = 3.14159265358979323846;

std::shared_ptr<Scheduler> make_cosine(const std::string& config) {
  auto b = testing::build_components("s: {component_key: scheduler, variant_key: warmup_cosine, config: " + config + "}\n");
  return testing::built<Scheduler>(b, "s");
}

TEST(WarmupCosineScheduler, WarmupThenHalfCosineToTheFloor) {
  auto s = make_cosine("{warmup_steps: 2, total_steps: 12, min_lr_ratio: 0.2}");
  EXPECT_DOUBLE_EQ(s->lr_factor(0), 0.5);  // warmup start
  EXPECT_DOUBLE_EQ(s->lr_factor(1), 1.0);  // warmup end
  EXPECT_DOUBLE_EQ(s->lr_factor(2), 1.0);  // decay starts at the peak
  EXPECT_NEAR(s->lr_factor(7), 0.2 + 0.8 * 0.5, 1e-12);  // half way
  EXPECT_NEAR(s->lr_factor(4), 0.2 + 0.8 * 0.5 * (1 + std::cos(kPi * 0.2)), 1e-12);
  EXPECT_NEAR(s->lr_factor(11), 0.2 + 0.8 * 0.5 * (1 + std::cos(kPi * 0.9)), 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_factor(12), 0.2);  // end
  EXPECT_DOUBLE_EQ(s->lr_factor(13), 0.2);  // past the end
  EXPECT_DOUBLE_EQ(s->lr_factor(1000), 0.2);
  for (std::int64_t step = 2; step < 12; ++step) EXPECT_GT(s->lr_factor(step), s->lr_factor(step + 1));
}

TEST(WarmupCosineScheduler, DefaultFloorIsATenth) {
  auto s = make_cosine("{total_steps: 10}");
  EXPECT_DOUBLE_EQ(s->lr_factor(0), 1.0);  // no warmup by default
  EXPECT_NEAR(s->lr_factor(5), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_factor(10), 0.1);
}

TEST(WarmupCosineScheduler, WarmupAsLongAsTheRunIsAllowed) {
  auto s = make_cosine("{warmup_steps: 4, total_steps: 4, min_lr_ratio: 0.0}");
  EXPECT_DOUBLE_EQ(s->lr_factor(3), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_factor(4), 0.0);
}

TEST(WarmupCosineScheduler, WarmupLongerThanTotalIsAConfigIssue) {
  try {
    make_cosine("{warmup_steps: 11, total_steps: 10}");
    FAIL() << "expected a ConfigIssue";
  } catch (const core::ConfigIssue& e) {
    EXPECT_EQ(e.path(), "components.s.config.warmup_steps");
    EXPECT_NE(e.message().find("warmup_steps (11) must not exceed total_steps (10)"), std::string::npos) << e.what();
  }
}

TEST(WarmupCosineScheduler, TotalStepsIsRequiredAndFloorIsBounded) {
  EXPECT_NE(testing::validation_error("s: {component_key: scheduler, variant_key: warmup_cosine, config: {}}\n")
                .find("components.s.config.total_steps"),
            std::string::npos);
  EXPECT_NE(testing::validation_error(
                "s: {component_key: scheduler, variant_key: warmup_cosine, config: {total_steps: 5, min_lr_ratio: 1.5}}\n")
                .find("components.s.config.min_lr_ratio"),
            std::string::npos);
}

}  // namespace warmup_cosine_test
}  // namespace tessera
