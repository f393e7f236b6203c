// scheduler/linear built through the real loader and factory: exact factors in warmup, along the
// straight decay, at and past total_steps, and the config it rejects.
#include <gtest/gtest.h>

#include <string>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/components/scheduler.hpp"
#include "test_support.hpp"

namespace tessera {
namespace linear_test {

std::shared_ptr<Scheduler> make_linear(const std::string& config) {
  auto b = testing::build_components("s: {component_key: scheduler, variant_key: linear, config: " + config + "}\n");
  return testing::built<Scheduler>(b, "s");
}

TEST(LinearScheduler, WarmupThenStraightLineToTheFloor) {
  auto s = make_linear("{warmup_steps: 4, total_steps: 14, min_lr_ratio: 0.5}");
  EXPECT_DOUBLE_EQ(s->lr_factor(0), 0.25);  // warmup start
  EXPECT_DOUBLE_EQ(s->lr_factor(3), 1.0);   // warmup end
  EXPECT_DOUBLE_EQ(s->lr_factor(4), 1.0);   // decay starts at the peak
  EXPECT_NEAR(s->lr_factor(6), 0.5 + 0.5 * 0.8, 1e-12);
  EXPECT_NEAR(s->lr_factor(9), 0.75, 1e-12);  // half way
  EXPECT_NEAR(s->lr_factor(13), 0.5 + 0.5 * 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_factor(14), 0.5);  // end
  EXPECT_DOUBLE_EQ(s->lr_factor(15), 0.5);  // past the end
  EXPECT_DOUBLE_EQ(s->lr_factor(100000), 0.5);
  // Equal steps down: it is a straight line.
  for (std::int64_t step = 5; step < 14; ++step) {
    EXPECT_NEAR(s->lr_factor(step - 1) - s->lr_factor(step), 0.05, 1e-12) << "step " << step;
  }
}

TEST(LinearScheduler, DefaultFloorIsZero) {
  auto s = make_linear("{total_steps: 10}");
  EXPECT_DOUBLE_EQ(s->lr_factor(0), 1.0);
  EXPECT_NEAR(s->lr_factor(5), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_factor(10), 0.0);
  EXPECT_DOUBLE_EQ(s->lr_factor(11), 0.0);
}

TEST(LinearScheduler, WarmupLongerThanTotalIsAConfigIssue) {
  try {
    make_linear("{warmup_steps: 5, total_steps: 4}");
    FAIL() << "expected a ConfigIssue";
  } catch (const core::ConfigIssue& e) {
    EXPECT_EQ(e.path(), "components.s.config.warmup_steps");
    EXPECT_NE(e.message().find("warmup_steps (5) must not exceed total_steps (4)"), std::string::npos) << e.what();
  }
}

}  // namespace linear_test
}  // namespace tessera
