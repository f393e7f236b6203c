// callback/memory_monitor driven with a real small model on the host: it writes this rank's
// memory as memory/* metrics on its steps only, and warns when the peak nears the capacity.
#include <gtest/gtest.h>

#include "tessera/components/callback.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/log.hpp"
#include "tessera/run/memory_stats.hpp"
#include "tessera/components/model.hpp"
#include "callback_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace memory_monitor_test {

using ::testing::internal::CaptureStderr;
using ::testing::internal::GetCapturedStderr;

struct Harness : testing::CallbackRig {
  explicit Harness(const std::string& config) : CallbackRig("memory_monitor", config, 0, 1) {
    run.communicator = core::make_local_communicator();
    log::set_level(log::Level::info);
  }

  std::shared_ptr<Callback>& monitor = callback;

  StepMetrics collect(std::int64_t step, std::string* logged = nullptr) {
    StepMetrics m;
    m.step = step;
    // What the trainer puts in every step's metrics.
    const MemoryStats now = memory_stats(c10::Device(c10::kCPU));
    m.memory_in_use_bytes = now.in_use;
    m.memory_peak_bytes = now.peak;
    m.memory_reserved_bytes = now.reserved;
    CallbackContext ctx{run, progress, *model, control};
    CaptureStderr();
    monitor->on_collect_metrics(ctx, m);
    const std::string out = GetCapturedStderr();
    if (logged) *logged = out;
    return m;
  }
};

TEST(MemoryMonitor, WritesThisRanksMemoryOnItsSteps) {
  Harness h("{every: 5}");
  std::string logged;
  const StepMetrics first = h.collect(1, &logged);
  EXPECT_NE(logged.find("memory at step 1 (process_rss)"), std::string::npos) << logged;
  ASSERT_TRUE(first.extra.count("memory/max_rank_peak_bytes"));
  const MemoryStats now = memory_stats(c10::Device(c10::kCPU));
  // One rank: its peak is both the largest and the smallest, and at least what it holds now-ish.
  EXPECT_EQ(first.extra.at("memory/max_rank_peak_bytes"), first.extra.at("memory/min_rank_peak_bytes"));
  EXPECT_GT(first.extra.at("memory/max_rank_in_use_bytes"), 1 << 20);
  EXPECT_NEAR(first.extra.at("memory/max_rank_in_use_bytes"), static_cast<double>(now.in_use), 64.0 * (1 << 20));
  EXPECT_GT(first.extra.at("memory/max_rank_peak_fraction"), 0);
  EXPECT_LT(first.extra.at("memory/max_rank_peak_fraction"), 1);
  EXPECT_TRUE(h.collect(3).extra.empty());
  EXPECT_FALSE(h.collect(5).extra.empty());
}

TEST(MemoryMonitor, WarnsWhenThePeakNearsTheCapacity) {
  Harness quiet("{every: 1}");
  std::string logged;
  quiet.collect(1, &logged);
  EXPECT_EQ(logged.find("memory: the fullest rank peaked"), std::string::npos) << logged;
  Harness loud("{every: 1, warn_fraction: 1.0e-9}");
  loud.collect(1, &logged);
  EXPECT_NE(logged.find("memory: the fullest rank peaked"), std::string::npos) << logged;
}

}  // namespace memory_monitor_test
}  // namespace tessera
