// scheduler/constant built through the real loader and factory: linear warmup, then flat.
#include <gtest/gtest.h>

#include <string>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/components/scheduler.hpp"
#include "test_support.hpp"

namespace tessera {
namespace constant_test {

std::shared_ptr<Scheduler> make_constant(const std::string& config) {
  auto b = testing::build_components("s: {component_key: scheduler, variant_key: constant, config: " + config + "}\n");
  return testing::built<Scheduler>(b, "s");
}

TEST(ConstantScheduler, WarmsUpLinearlyThenStaysAtOne) {
  auto s = make_constant("{warmup_steps: 4}");
  EXPECT_DOUBLE_EQ(s->lr_factor(0), 0.25);  // the first step already has a non-zero lr
  EXPECT_DOUBLE_EQ(s->lr_factor(1), 0.5);
  EXPECT_DOUBLE_EQ(s->lr_factor(2), 0.75);
  EXPECT_DOUBLE_EQ(s->lr_factor(3), 1.0);  // last warmup step
  EXPECT_DOUBLE_EQ(s->lr_factor(4), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_factor(1000000), 1.0);
}

TEST(ConstantScheduler, WithoutWarmupIsOneFromTheStart) {
  auto s = make_constant("{}");
  EXPECT_DOUBLE_EQ(s->lr_factor(0), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_factor(7), 1.0);
}

TEST(ConstantScheduler, NegativeWarmupIsRejected) {
  EXPECT_NE(testing::validation_error("s: {component_key: scheduler, variant_key: constant, config: {warmup_steps: -1}}\n")
                .find("components.s.config.warmup_steps"),
            std::string::npos);
}

}  // namespace constant_test
}  // namespace tessera
