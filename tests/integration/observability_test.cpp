// Observability end to end through `tessera`: the health watchdog ends a stalled run (one rank,
// and two ranks where one stalls) and says where every rank is.
#include <chrono>
#include <filesystem>
#include <regex>

#include "cli_fixture.hpp"

namespace tessera {
namespace observability_test {

using Clock = std::chrono::steady_clock;
// A stalled run must end (the watchdog's timeout is 5 s); this only catches a run that never does,
// with room for a loaded machine: the tests check the behaviour, not the machine's speed.
constexpr double kHangGuardSeconds = 180;

// tiny.yaml with the health callback's watchdog on.
std::string watchdog_config(const TempDir& dir, const std::string& tiny) {
  return dir.write("watchdog.yaml",
                   "include: [" + tiny + "]\n"
                   "components:\n"
                   "  callbacks:\n"
                   "    - {component_key: callback, variant_key: console_logger, config: {every: 1}}\n"
                   "    - {component_key: callback, variant_key: health, config: {hang_timeout_s: 5}}\n"
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
  EXPECT_LT(seconds, kHangGuardSeconds) << "the stalled run was not ended\n" << out;
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
  const int rc = run_command("TESSERA_FAILPOINT=trainer.step@3:stall TESSERA_FAILPOINT_RANK=1 " +
                                 tessera("launch --nproc-per-node 2 -- train " + watchdog_config(dir_, tiny()) +
                                         data_set() + " --run-dir " + dir_.file("stalled")),
                             out);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_NE(rc, 0) << out;
  EXPECT_LT(seconds, kHangGuardSeconds) << "the stalled run was not ended\n" << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\[rank 1\] .*failpoint trainer.step: stalling)"))) << out;
  // Both ranks stop progressing at about the same moment, so either watchdog may fire first (on a
  // loaded machine, often the stalled rank's own); the one that does lists where each rank is,
  // the other's position read from its status file, and calls no live rank frozen.
  std::smatch first;
  ASSERT_TRUE(std::regex_search(out, first, std::regex(R"(\[rank (\d)\] .*health: no progress for)"))) << out;
  const std::string reporter = R"(\[rank )" + first[1].str() + R"(\] .*)";
  EXPECT_TRUE(std::regex_search(out, std::regex(reporter + "health:   rank 0: step 3"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(reporter + "health:   rank 1: step 3: drawing data"))) << out;
  EXPECT_EQ(out.find("status not refreshed"), std::string::npos) << "a live rank was reported as frozen\n" << out;
}

TEST_F(Cli, EverythingOnRunsAndEverySinkAndMonitorWrites) {
  const std::string run_dir = dir_.file("everything");
  std::string out;
  const std::string args = " --set components.train_data.config.path=" + data_ +
                           " --set components.callbacks.1.config.data.config.path=" + data_ +
                           " --set components.callbacks.1.config.every=6 --set trainer.max_steps=12" +
                           " --set components.scheduler.config.warmup_steps=2 --set settings.num_threads=2" +
                           " --set plugins.paths=[]";  // the binary finds the built plugins itself
  ASSERT_EQ(run_command(tessera("train " + testing::source_dir() + "/configs/everything.yaml" + args + " --run-dir " +
                                run_dir),
                        out),
            0)
      << out;
  const auto steps = read_metrics(run_dir + "/metrics.jsonl");
  ASSERT_EQ(steps.size(), 12u);
  for (const char* key : {"mfu", "eta_s", "moe/maxvio", "moe/layer0/entropy", "moe/aux_loss", "time_communication_s",
                          "memory_peak_bytes"}) {
    EXPECT_TRUE(steps.back().contains(key)) << key;
  }
  EXPECT_TRUE(steps.front().contains("memory/max_rank_peak_bytes"));  // memory_monitor at step 1
  EXPECT_EQ(read_eval_metrics(run_dir + "/metrics.jsonl").size(), 2u);  // steps 6 and 12
  EXPECT_NE(out.find("eval val at step 12"), std::string::npos) << out;
  const std::string trace = run_dir + "/profiles/rank_0/trace_steps_10-11.json";
  EXPECT_TRUE(std::filesystem::exists(trace)) << out;
  // tools/bench/trace_summary.py reads the trace back: both steps, and where their time went.
  std::string summary;
  ASSERT_EQ(run_command("python3 " + testing::source_dir() + "/tools/bench/trace_summary.py " + trace + " --top 5", summary),
            0)
      << summary;
  EXPECT_NE(summary.find("ProfilerStep#10: "), std::string::npos) << summary;
  EXPECT_NE(summary.find("ProfilerStep#11: "), std::string::npos) << summary;
  EXPECT_NE(summary.find("operators of"), std::string::npos) << summary;
  EXPECT_NE(summary.find("aten::"), std::string::npos) << summary;
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/health/rank_0.txt"));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints/step_00000012/metadata.json"));
  bool events = false;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir + "/tensorboard")) {
    events = events || entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_TRUE(events);
  EXPECT_NE(out.find("sample: The "), std::string::npos) << out;
}

// Two ranks evaluate their shards and reduce Σloss and Σtokens: the result is one rank's over the
// same sequences (spaces are ignored labels, so micro-batches carry different target counts).
TEST_F(Cli, TwoRanksEvaluateLikeOneRankWithTheirBatchesTogether) {
  const std::string config = dir_.write(
      "eval2.yaml", "include: [" + tiny() + "]\n"
                    "components:\n"
                    "  train_data: {config: {ignore_token: 32}}\n"
                    "  callbacks:\n"
                    "    - component_key: callback\n"
                    "      variant_key: evaluation\n"
                    "      config:\n"
                    "        data: {component_key: dataset, variant_key: tokens, config: {path: " + data_ +
                    ", seq_len: 32, ignore_token: 32}}\n"
                    "        loss: {instance_key: loss, pass_type: BY_REFERENCE}\n"
                    "        every: 2\n"
                    "        batches: 3\n");
  const std::string common = data_set() + " --set trainer.max_steps=4 --set trainer.micro_batch_size=4" +
                             " --set components.scheduler.config.warmup_steps=2";
  std::string out;
  ASSERT_EQ(run_command(tessera("train " + config + common + " --set trainer.grad_accum=2" +
                                " --set components.callbacks.0.config.micro_batch_size=4 --run-dir " + dir_.file("one")),
                        out),
            0)
      << out;
  ASSERT_EQ(run_command(tessera("launch --nproc-per-node 2 -- train " + config + common + " --set trainer.grad_accum=1" +
                                " --set components.callbacks.0.config.micro_batch_size=2 --run-dir " + dir_.file("two")),
                        out),
            0)
      << out;
  const auto one = read_eval_metrics(dir_.file("one") + "/metrics.jsonl");
  const auto two = read_eval_metrics(dir_.file("two") + "/metrics.jsonl");
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(two.size(), 2u);
  for (size_t i = 0; i < one.size(); ++i) {
    const double a = one[i]["val/loss"], b = two[i]["val/loss"];
    EXPECT_NEAR(b, a, 1e-5 * a) << "evaluation " << i;
    EXPECT_EQ(two[i]["val/tokens"], one[i]["val/tokens"]);
  }
}

TEST_F(Cli, PlotTurnsARunsMetricsIntoPngs) {
  const std::string python = testing::source_dir() + "/.venv/bin/python3";
  std::string out;
  if (run_command(python + " -c 'import matplotlib'", out) != 0) {
    GTEST_SKIP() << "matplotlib is not installed in .venv (tools/setup.sh installs it): " << out;
  }
  // A short run with an evaluation every 3 steps, so the loss plot has both series.
  const std::string config = dir_.write(
      "eval.yaml", "include: [" + tiny() + "]\n"
                   "components:\n"
                   "  callbacks:\n"
                   "    - component_key: callback\n"
                   "      variant_key: evaluation\n"
                   "      config:\n"
                   "        data: {component_key: dataset, variant_key: tokens, config: {path: " + data_ + ", seq_len: 32}}\n"
                   "        loss: {instance_key: loss, pass_type: BY_REFERENCE}\n"
                   "        every: 3\n"
                   "        batches: 2\n");
  const std::string run_dir = dir_.file("run");
  ASSERT_EQ(run_command(tessera("train " + config + data_set() + " --set trainer.max_steps=6 --run-dir " + run_dir), out), 0)
      << out;
  ASSERT_EQ(read_eval_metrics(run_dir + "/metrics.jsonl").size(), 2u);
  const std::string plot = python + " " + testing::source_dir() + "/tools/plot/plot_metrics.py ";
  ASSERT_EQ(run_command(plot + run_dir, out), 0) << out;
  for (const char* name : {"loss", "lr", "grad_norm", "tokens_per_s"}) {
    const std::string png = run_dir + "/plots/" + name + ".png";
    std::ifstream in(png, std::ios::binary);
    std::string head(8, '\0');
    in.read(head.data(), 8);
    EXPECT_EQ(head, std::string("\x89PNG\r\n\x1a\n", 8)) << png;
    in.seekg(0, std::ios::end);
    EXPECT_GT(in.tellg(), 5000) << png;
  }
  // No MFU on a CPU without settings.peak_flops: no MFU plot either.
  EXPECT_FALSE(std::ifstream(run_dir + "/plots/mfu.png").good());
  // A directory without metrics is one clear error.
  EXPECT_NE(run_command(plot + dir_.file("nothing"), out), 0);
  EXPECT_NE(out.find("metrics.jsonl: no such file"), std::string::npos) << out;
}

}  // namespace observability_test
}  // namespace tessera
