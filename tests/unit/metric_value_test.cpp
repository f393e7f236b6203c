// tessera::AsyncValues / MetricValue on the CPU: a copy taken when the step ends (later changes
// to the device tensor do not reach it), ready at once, and read like the double it stands for.
// On a GPU the same copy is non-blocking (tests/unit/cuda_step_test.cpp runs there).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sstream>

#include "tessera/run/metric_value.hpp"

namespace tessera {
namespace metric_value_test {

TEST(MetricValue, IsACopyOfTheValuesWhenTaken) {
  at::Tensor values = at::tensor(std::vector<float>{2.5f, 0.75f});
  const auto copied = AsyncValues::copy_of(values);
  values.fill_(9.0f);  // the next step reuses the device buffers
  const MetricValue loss(copied, 0), norm(copied, 1);
  EXPECT_TRUE(loss.ready());
  EXPECT_DOUBLE_EQ(loss.value(), 2.5);
  EXPECT_DOUBLE_EQ(static_cast<double>(norm), 0.75);
  std::ostringstream text;
  text << loss;
  EXPECT_EQ(text.str(), "2.5");
}

TEST(MetricValue, AHostValueIsReadyAndItself) {
  MetricValue v = 1.25;
  EXPECT_TRUE(v.ready());
  EXPECT_DOUBLE_EQ(v, 1.25);
  EXPECT_DOUBLE_EQ(MetricValue().value(), 0.0);
}

}  // namespace metric_value_test
}  // namespace tessera
