// A plugin that throws during a run, through the real `tessera` (one rank, and two launched
// ranks with only one of them failing): one error naming the component, the event and the step;
// every rank exits non-zero within seconds (not at the collective timeout); an emergency
// checkpoint when the fault comes at a step boundary, where the state is consistent, and a
// plain statement that none was written when it comes inside a step. The components that throw
// are the test plugin tests/plugins/faulty. A factory that throws while the run is built is
// Cli.FactoryExceptionExitsTwoWithTheComponentPath.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "cli_fixture.hpp"
#include "tessera/core/checkpoint/checkpoint_reader.hpp"

namespace tessera {
namespace plugin_fault_test {

namespace fs = std::filesystem;

// A failure on one rank ends every rank promptly: well under the 300 s collective timeout that
// waiting for a lost peer would take, with room for a loaded machine.
constexpr double kPromptSeconds = 150;

class PluginFaults : public Cli {
 protected:
  // Runs `tessera train` (ranks > 1: through `tessera launch`) on the tiny spec with the faulty
  // plugin on the search path and `args`; returns the exit code, and the wall time in `seconds`.
  int run(int ranks, const std::string& args, std::string& out, double& seconds) {
    const std::string train = "train " + tiny() + " --plugin-path " + testing::test_plugin_dir("faulty") +
                              " --set settings.collective_timeout_s=300 --set components.scheduler.config.warmup_steps=2 "
                              "--set trainer.max_steps=6 --set checkpoint.export_at_end=false --run-dir " +
                              dir_.file("run") + " " + args;
    const auto start = std::chrono::steady_clock::now();
    const int rc = run_command(
        tessera(ranks == 1 ? train : "launch --nproc-per-node " + std::to_string(ranks) + " -- " + train), out);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return rc;
  }
  // The spec's callbacks: the console logger, then callback/faulty with `config`.
  static std::string faulty_callback(const std::string& config) {
    return " --set 'components.callbacks=[{component_key: callback, variant_key: console_logger},"
           " {component_key: callback, variant_key: faulty, config: " + config + "}]'";
  }
  std::string faulty_data(const std::string& config) const {
    return " --set 'components.train_data={component_key: dataset, variant_key: faulty, config: {data: {component_key: "
           "dataset, variant_key: tokens, config: {path: " + data_ + ", seq_len: 32}}, " + config + "}}'";
  }
  std::string faulty_loss(const std::string& config) const {
    return data_set() + " --set 'components.loss={component_key: loss, variant_key: faulty, config: {loss: "
                        "{component_key: loss, variant_key: cross_entropy}, " + config + "}}'";
  }
  std::string checkpoint(std::int64_t step) const {
    return dir_.file("run") + "/checkpoints/step_0000000" + std::to_string(step);
  }
};

TEST_F(PluginFaults, ACallbackFailingAfterAStepOnOneRankStopsBothWithAnEmergencyCheckpoint) {
  std::string out;
  double seconds = 0;
  EXPECT_NE(run(2, data_set() + faulty_callback("{event: on_step_end, at_step: 3, rank: 1}"), out, seconds), 0) << out;
  EXPECT_LT(seconds, kPromptSeconds) << out;
  EXPECT_NE(out.find("callback/faulty (components.callbacks[1]) failed in on_step_end at step 3: planted fault in "
                     "on_step_end on rank 1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("an emergency checkpoint of step 3 was written"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1: a callback failed after step 3"), std::string::npos) << "rank 0 says whose it was: " << out;
  EXPECT_NO_THROW(core::verify_checkpoint(checkpoint(3)));
  // Without the faulty callback, the run continues from the emergency checkpoint.
  ASSERT_EQ(run(2, data_set() + " --resume auto", out, seconds), 0) << out;
  EXPECT_NE(out.find("at step 3 "), std::string::npos) << out;
}

// The callbacks after the failed one still run on the failing rank: memory_monitor all-reduces in
// on_collect_metrics, so skipping it there would leave the ranks in different collectives.
TEST_F(PluginFaults, ACallbackFailingInOnCollectMetricsBeforeACollectiveOneSavesTheStep) {
  std::string out;
  double seconds = 0;
  const std::string callbacks =
      " --set 'components.callbacks=[{component_key: callback, variant_key: faulty, config: {event: "
      "on_collect_metrics, at_step: 2, rank: 1}}, {component_key: callback, variant_key: memory_monitor, config: "
      "{every: 1}}]'";
  EXPECT_NE(run(2, data_set() + callbacks, out, seconds), 0) << out;
  EXPECT_LT(seconds, kPromptSeconds) << out;
  EXPECT_NE(out.find("callback/faulty (components.callbacks[0]) failed in on_collect_metrics at step 2"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("an emergency checkpoint of step 2 was written"), std::string::npos) << out;
  EXPECT_NO_THROW(core::verify_checkpoint(checkpoint(2)));
}

TEST_F(PluginFaults, ADatasetFailingOnOneRankEndsBothPromptlyWithoutACheckpoint) {
  std::string out;
  double seconds = 0;
  // Batch 5 is the first micro-batch of step 3 (grad_accum 2), read ahead by the prefetch thread.
  EXPECT_NE(run(2, faulty_data("fail_at_batch: 5, rank: 1"), out, seconds), 0) << out;
  EXPECT_LT(seconds, kPromptSeconds) << out;
  EXPECT_NE(out.find("dataset/faulty (components.train_data) failed in next_batch at step 3: planted fault in "
                     "next_batch on rank 1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("the step was cut short, so no emergency checkpoint was written"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(checkpoint(2))) << "nothing is saved from the middle of a step";
  EXPECT_FALSE(fs::exists(checkpoint(3)));
}

TEST_F(PluginFaults, ALossFailingInForwardNamesTheLossAndTheStep) {
  std::string out;
  double seconds = 0;
  // Call 3 is the first micro-batch of step 2.
  EXPECT_EQ(run(1, faulty_loss("fail_in: forward, at_call: 3"), out, seconds), 1) << out;
  EXPECT_NE(out.find("loss/faulty (components.loss) failed in forward at step 2: planted fault in the loss's forward"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("frame #"), std::string::npos) << "no C++ backtrace: " << out;
}

TEST_F(PluginFaults, ABackwardFailingOnOneRankEndsBothPromptly) {
  std::string out;
  double seconds = 0;
  EXPECT_NE(run(2, faulty_loss("fail_in: backward, at_call: 3, rank: 0"), out, seconds), 0) << out;
  EXPECT_LT(seconds, kPromptSeconds) << out;
  EXPECT_NE(out.find("model/gpt (components.model) with loss/faulty (components.loss) failed in backward at step 2: "
                     "planted fault in the loss's backward on rank 0"),
            std::string::npos)
      << out;
}

}  // namespace plugin_fault_test
}  // namespace tessera
