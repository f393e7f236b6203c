// Observability end to end through `tessera`: the health watchdog ends a stalled run (one rank,
// and two ranks where one stalls) and says where every rank is.
#include <chrono>
#include <regex>

#include "cli_fixture.hpp"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// tiny.yaml with the health callback's watchdog on.
std::string watchdog_config(const TempDir& dir, const std::string& tiny) {
  return dir.write("watchdog.yaml",
                   "include: [" + tiny + "]\n"
                   "components:\n"
                   "  callbacks:\n"
                   "    - {component_key: callback, variant_key: console_logger, config: {every: 1}}\n"
                   "    - {component_key: callback, variant_key: health, config: {hang_timeout_s: 2}}\n"
                   "settings: {collective_timeout_s: 120}\n");
}

TEST_F(Cli, TheWatchdogEndsAStalledRunAndSaysWhereItIs) {
  std::string out;
  const auto start = Clock::now();
  const int rc = run_command("TESSERA_FAILPOINT=trainer.step@3:stall " +
                                 tessera("train " + watchdog_config(dir_, tiny()) + data_set() + " --run-dir " +
                                         dir_.file("stalled")),
                             out);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(rc, 3) << out;
  EXPECT_LT(seconds, 30) << out;
  EXPECT_NE(out.find("failpoint trainer.step: stalling"), std::string::npos) << out;
  EXPECT_NE(out.find("health: no progress for"), std::string::npos) << out;
  EXPECT_NE(out.find("health:   rank 0: step 3: drawing data"), std::string::npos) << out;
  EXPECT_NE(out.find("the run looks hung; exiting with code 3"), std::string::npos) << out;
  // Steps 1 and 2 finished and were logged before the stall.
  EXPECT_EQ(read_metrics(dir_.file("stalled") + "/metrics.jsonl").size(), 2u);
}

TEST_F(Cli, WhenOneRankStallsTheOthersWatchdogReportsBothRanks) {
  std::string out;
  const auto start = Clock::now();
  // Rank 1 stalls at the start of step 3; rank 0 then waits for it in the step's first collective.
  run_command("TESSERA_FAILPOINT=trainer.step@3:stall TESSERA_FAILPOINT_RANK=1 " +
                  tessera("launch --nproc-per-node 2 -- train " + watchdog_config(dir_, tiny()) + data_set() +
                          " --run-dir " + dir_.file("stalled")),
              out);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 60) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\[rank 1\] .*failpoint trainer.step: stalling)"))) << out;
  // Rank 0's watchdog lists where each rank is, rank 1's position read from its status file.
  const std::regex rank0_report(R"(\[rank 0\] .*health:   rank 0: step 3)");
  const std::regex rank1_seen_by_0(R"(\[rank 0\] .*health:   rank 1: step 3: drawing data)");
  EXPECT_TRUE(std::regex_search(out, rank0_report)) << out;
  EXPECT_TRUE(std::regex_search(out, rank1_seen_by_0)) << out;
}

}  // namespace
}  // namespace tessera
