// scheduler/warmup_stable_decay and the options every decaying schedule shares (warmup_ratio,
// lr_min), built through the real loader and factory: exact lrs in each phase, each decay shape,
// and the configs they reject.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/components/scheduler.hpp"
#include "test_support.hpp"

namespace tessera {
namespace warmup_stable_decay_test {

std::shared_ptr<Scheduler> make(const std::string& variant, const std::string& config) {
  auto b = testing::build_components("s: {component_key: scheduler, variant_key: " + variant + ", config: " + config + "}\n");
  return testing::built<Scheduler>(b, "s");
}

std::string error_of(const std::string& variant, const std::string& config) {
  try {
    make(variant, config);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(WarmupStableDecay, WarmsUpHoldsThenDecaysOverTheLastFraction) {
  // 100 steps: warmup 10, stable until 80, 1-sqrt decay over the last 20 to 0.1.
  auto s = make("warmup_stable_decay", "{warmup_steps: 10, total_steps: 100, decay_ratio: 0.2, min_lr_ratio: 0.1}");
  EXPECT_DOUBLE_EQ(s->lr_factor(0), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_factor(9), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_factor(10), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_factor(79), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_factor(80), 1.0);  // the decay's first step is still the peak
  EXPECT_NEAR(s->lr_factor(85), 0.1 + 0.9 * (1 - std::sqrt(0.25)), 1e-12);
  EXPECT_NEAR(s->lr_factor(95), 0.1 + 0.9 * (1 - std::sqrt(0.75)), 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_factor(100), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_factor(150), 0.1);
  EXPECT_DOUBLE_EQ(s->lr(50, 3e-4), 3e-4);
}

TEST(WarmupStableDecay, EveryShape) {
  const std::string base = "total_steps: 10, decay_ratio: 0.5, decay_shape: ";
  auto linear = make("warmup_stable_decay", "{" + base + "linear}");
  auto cosine = make("warmup_stable_decay", "{" + base + "cosine}");
  auto sqrt = make("warmup_stable_decay", "{" + base + "1-sqrt}");
  // Decay from step 5 to 10; at step 7 the progress is 0.4.
  EXPECT_NEAR(linear->lr_factor(7), 0.6, 1e-12);
  EXPECT_NEAR(cosine->lr_factor(7), 0.5 * (1 + std::cos(3.14159265358979323846 * 0.4)), 1e-12);
  EXPECT_NEAR(sqrt->lr_factor(7), 1 - std::sqrt(0.4), 1e-12);
  EXPECT_NE(error_of("warmup_stable_decay", "{" + base + "square}").find("decay_shape"), std::string::npos);
}

TEST(DecayingSchedules, WarmupRatioIsAFractionOfTotalSteps) {
  for (const std::string variant : {"linear", "warmup_cosine", "warmup_stable_decay"}) {
    SCOPED_TRACE(variant);
    auto by_ratio = make(variant, "{warmup_ratio: 0.1, total_steps: 200}");
    auto by_steps = make(variant, "{warmup_steps: 20, total_steps: 200}");
    for (std::int64_t step : {0, 5, 19, 20, 100, 199, 200}) EXPECT_DOUBLE_EQ(by_ratio->lr_factor(step), by_steps->lr_factor(step)) << step;
    EXPECT_NE(error_of(variant, "{warmup_steps: 5, warmup_ratio: 0.1, total_steps: 200}").find("not both"),
              std::string::npos);
  }
}

TEST(DecayingSchedules, LrMinIsAnAbsoluteFloor) {
  for (const std::string variant : {"linear", "warmup_cosine", "warmup_stable_decay"}) {
    SCOPED_TRACE(variant);
    auto s = make(variant, "{total_steps: 100, lr_min: 1.0e-5}");
    EXPECT_DOUBLE_EQ(s->lr(100, 1e-3), 1e-5);
    EXPECT_DOUBLE_EQ(s->lr(500, 3e-4), 1e-5);  // whatever the base lr
    EXPECT_DOUBLE_EQ(s->lr(0, 1e-3), 1e-3);
    EXPECT_GT(s->lr(90, 1e-3), 1e-5);
    EXPECT_NE(error_of(variant, "{total_steps: 100, lr_min: 1.0e-5, min_lr_ratio: 0.1}").find("not both"),
              std::string::npos);
  }
  // Without lr_min, lr is the base lr times the factor.
  auto plain = make("warmup_cosine", "{total_steps: 100}");
  EXPECT_DOUBLE_EQ(plain->lr(100, 1e-3), 1e-3 * 0.1);
}

TEST(WarmupStableDecay, WarmupMayNotRunIntoTheDecay) {
  EXPECT_NE(error_of("warmup_stable_decay", "{warmup_steps: 90, total_steps: 100, decay_ratio: 0.2}").find("overlap"),
            std::string::npos);
}

}  // namespace warmup_stable_decay_test
}  // namespace tessera
