// callback/tensorboard built through the real loader and factory and driven directly. Its files
// are read back by a TFRecord reader here that checks both CRCs of every record and decodes the
// Event protos from the wire format by hand (independent of the plugin's generated code), and
// by TensorBoard's own Python reader when the project's .venv has it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/components/model.hpp"
#include "callback_rig.hpp"
#include "event_file_reader.hpp"
#include "test_support.hpp"

namespace tessera {
namespace tensorboard_test {

namespace fs = std::filesystem;
using namespace tensorboard_testing;

// ---- The callback, built for real ------------------------------------------------------

struct Harness : testing::CallbackRig {
  explicit Harness(const std::string& config, std::int64_t rank = 0)
      : CallbackRig("tensorboard", config, rank) {
    progress.max_steps = 10;
  }

  std::shared_ptr<Callback>& board = callback;

  fs::path board_dir() const { return fs::path(run.run_dir) / "tensorboard"; }
  void begin() {
    CallbackContext ctx = context();
    board->on_train_begin(ctx);
  }
  void step_end(const StepMetrics& m) {
    progress.step = m.step;
    CallbackContext ctx = context();
    board->on_step_end(ctx, m);
  }
  void eval_end(const EvalMetrics& m) {
    CallbackContext ctx = context();
    board->on_evaluation_end(ctx, m);
  }
  void end() {
    CallbackContext ctx = context();
    board->on_train_end(ctx);
  }
};

StepMetrics metrics_of(std::int64_t step) {
  const double s = static_cast<double>(step);
  StepMetrics m;
  m.step = step;
  m.loss = 3.0 - 0.25 * s;
  m.grad_norm = 0.125 * s;
  m.lr = 6e-4;
  m.tokens_per_s = 1024.5;
  m.tokens_per_s_per_device = 512.25;
  m.step_time_s = 0.5;
  m.time_data_s = 0.05;
  m.time_forward_backward_s = 0.375;
  m.time_optimizer_s = 0.0625;
  m.time_communication_s = 0.03125;
  m.memory_in_use_bytes = 1 << 20;
  m.memory_peak_bytes = 3 << 20;
  m.memory_reserved_bytes = 4 << 20;
  return m;
}

// The tags and values a step's Event must carry, in the order the plugin writes them.
std::vector<std::pair<std::string, float>> expected_scalars(const StepMetrics& m) {
  std::vector<std::pair<std::string, float>> v = {
      {"train/loss", static_cast<float>(m.loss)},
      {"train/grad_norm", static_cast<float>(m.grad_norm)},
      {"train/lr", static_cast<float>(m.lr)},
      {"train/tokens_per_s", static_cast<float>(m.tokens_per_s)},
      {"train/tokens_per_s_per_device", static_cast<float>(m.tokens_per_s_per_device)},
  };
  if (m.mfu) v.emplace_back("train/mfu", static_cast<float>(*m.mfu));
  v.insert(v.end(), {
      {"time/step_s", static_cast<float>(m.step_time_s)},
      {"time/data_s", static_cast<float>(m.time_data_s)},
      {"time/forward_backward_s", static_cast<float>(m.time_forward_backward_s)},
      {"time/optimizer_s", static_cast<float>(m.time_optimizer_s)},
      {"time/communication_s", static_cast<float>(m.time_communication_s)},
      {"memory/in_use_bytes", static_cast<float>(m.memory_in_use_bytes)},
      {"memory/peak_bytes", static_cast<float>(m.memory_peak_bytes)},
      {"memory/reserved_bytes", static_cast<float>(m.memory_reserved_bytes)},
  });
  for (const auto& [tag, value] : m.extra) v.emplace_back(tag, static_cast<float>(value));
  return v;
}

TEST(TensorBoard, WritesFileVersionFirstThenTheStepAndEvalScalars) {
  Harness h("{}");
  h.begin();
  StepMetrics s1 = metrics_of(1);
  s1.extra["moe/layer0/maxvio"] = 0.75;
  StepMetrics s2 = metrics_of(2);
  s2.mfu = 0.375;
  h.step_end(s1);
  h.step_end(s2);
  h.eval_end(EvalMetrics{2, "val", {{"loss", 2.5}, {"perplexity", 12.25}}});
  h.step_end(metrics_of(3));
  h.end();

  const auto files = event_files(h.board_dir());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(std::regex_match(files[0].filename().string(),
                               std::regex(R"(events\.out\.tfevents\.\d{10}\.[^.].*\.\d+\.0)")))
      << files[0];
  const auto events = read_events(files[0]);
  ASSERT_EQ(events.size(), 5u);
  ASSERT_TRUE(events[0].file_version);
  EXPECT_EQ(*events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.6e9);  // seconds since the epoch

  const std::vector<std::pair<std::int64_t, std::vector<std::pair<std::string, float>>>> want = {
      {1, expected_scalars(s1)},
      {2, expected_scalars(s2)},
      {2, {{"val/loss", 2.5f}, {"val/perplexity", 12.25f}}},
      {3, expected_scalars(metrics_of(3))},
  };
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Event& e = events[i + 1];
    EXPECT_EQ(e.step, want[i].first) << "event " << i + 1;
    ASSERT_TRUE(e.scalars) << "event " << i + 1;
    EXPECT_EQ(*e.scalars, want[i].second) << "event " << i + 1;
    EXPECT_FALSE(e.file_version);
  }
  // The extra key is its own tag, as is; mfu only where the step had one.
  EXPECT_EQ(events[1].scalars->back(), (std::pair<std::string, float>{"moe/layer0/maxvio", 0.75f}));
  const auto has_mfu = [](const Event& e) {
    for (const auto& [tag, value] : *e.scalars) if (tag == "train/mfu") return true;
    return false;
  };
  EXPECT_FALSE(has_mfu(events[1]));
  EXPECT_TRUE(has_mfu(events[2]));
}

TEST(TensorBoard, ACorruptedByteFailsTheCrcCheck) {
  // The reader's checks are only as good as its CRC: the standard CRC-32C check value.
  ASSERT_EQ(crc32c("123456789", 9), 0xE3069283u);
  Harness h("{}");
  h.begin();
  h.step_end(metrics_of(1));
  h.step_end(metrics_of(2));
  h.end();
  const auto files = event_files(h.board_dir());
  ASSERT_EQ(files.size(), 1u);
  const std::string good = read_file(files[0]);
  ASSERT_EQ(read_records(good).size(), 3u);
  const std::size_t first = 12 + read_le(good.data(), 8) + 4;  // where record 1 starts

  std::string data_flip = good;
  data_flip[first + 12 + 5] ^= 0x01;  // a byte inside record 1's Event
  EXPECT_EQ(framing_error(data_flip), "record 1: data CRC mismatch");

  std::string length_flip = good;
  length_flip[first] ^= 0x01;  // record 1's length
  EXPECT_EQ(framing_error(length_flip), "record 1: length CRC mismatch");
}

TEST(TensorBoard, WritesEveryNStepsAndNonFiniteValuesAsTheyAre) {
  Harness h("{every: 2, dir: boards/a}");
  h.begin();
  for (std::int64_t step = 1; step <= 5; ++step) {
    StepMetrics m = metrics_of(step);
    if (step == 4) {
      m.loss = std::numeric_limits<double>::quiet_NaN();
      m.grad_norm = std::numeric_limits<double>::infinity();
    }
    h.step_end(m);
  }
  h.end();
  EXPECT_FALSE(fs::exists(h.board_dir()));
  const auto files = event_files(fs::path(h.run.run_dir) / "boards/a");
  ASSERT_EQ(files.size(), 1u);
  const auto events = read_events(files[0]);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].step, 2);
  EXPECT_EQ(events[2].step, 4);
  ASSERT_TRUE(events[2].scalars);
  const auto& scalars = *events[2].scalars;
  EXPECT_EQ(scalars[0].first, "train/loss");
  EXPECT_TRUE(std::isnan(scalars[0].second));
  EXPECT_EQ(scalars[1].first, "train/grad_norm");
  EXPECT_TRUE(std::isinf(scalars[1].second));
}

TEST(TensorBoard, AResumedRunStartsANewSessionAtItsFirstStep) {
  Harness h("{}");
  h.progress.step = 4;  // continued from the step-4 checkpoint
  h.begin();
  h.step_end(metrics_of(5));
  h.end();
  const auto events = read_events(event_files(h.board_dir()).at(0));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[0].file_version);
  ASSERT_TRUE(events[1].session_status);
  EXPECT_EQ(*events[1].session_status, 1);  // SessionLog.START
  EXPECT_EQ(events[1].step, 5);
  EXPECT_FALSE(events[1].scalars);
  EXPECT_EQ(events[2].step, 5);

  // A fresh run has no session marker.
  Harness fresh("{}");
  fresh.begin();
  fresh.step_end(metrics_of(1));
  fresh.end();
  for (const Event& e : read_events(event_files(fresh.board_dir()).at(0))) EXPECT_FALSE(e.session_status);

  // A run started again from step 0 in a folder with an earlier attempt's events: the marker at
  // step 1 drops the earlier attempt's steps in TensorBoard.
  Harness again("{}");
  fs::create_directories(again.board_dir());
  std::ofstream(again.board_dir() / "events.out.tfevents.1.host.1.0") << "";
  again.begin();
  again.step_end(metrics_of(1));
  again.end();
  fs::path written;
  for (const auto& file : event_files(again.board_dir())) {
    if (fs::file_size(file) > 0) written = file;
  }
  const auto restarted = read_events(written);
  ASSERT_GE(restarted.size(), 2u);
  ASSERT_TRUE(restarted[1].session_status);
  EXPECT_EQ(*restarted[1].session_status, 1);
  EXPECT_EQ(restarted[1].step, 1);
}

TEST(TensorBoard, FlushesOnTheIntervalAndOnException) {
  Harness slow("{flush_every_s: 1000}");
  slow.begin();
  const fs::path file = event_files(slow.board_dir()).at(0);
  EXPECT_EQ(read_records(read_file(file)).size(), 1u);  // the header record, flushed at begin
  slow.step_end(metrics_of(1));
  slow.step_end(metrics_of(2));
  EXPECT_EQ(read_records(read_file(file)).size(), 1u);  // still buffered
  CallbackContext ctx = slow.context();
  slow.board->on_exception(ctx, "boom");
  EXPECT_EQ(read_records(read_file(file)).size(), 3u);

  Harness eager("{flush_every_s: 0}");
  eager.begin();
  eager.step_end(metrics_of(1));
  EXPECT_EQ(read_records(read_file(event_files(eager.board_dir()).at(0))).size(), 2u);
}

TEST(TensorBoard, OnlyRankZeroWrites) {
  Harness h("{}", /*rank=*/1);
  h.begin();
  h.step_end(metrics_of(1));
  h.eval_end(EvalMetrics{1, "val", {{"loss", 2.0}}});
  h.end();
  EXPECT_FALSE(fs::exists(h.board_dir()));
}

// TensorBoard's own reader, run on two attempts of one run: the first logged steps 1-6 and
// died, the second resumed from the step-4 checkpoint and logged steps 5-6 again.
TEST(TensorBoard, TensorBoardsPythonReaderSeesTheScalarsAndDropsOrphanedSteps) {
  const std::string python = testing::source_dir() + "/.venv/bin/python3";
  std::string output;
  if (testing::run_command("'" + python + "' -c 'import tensorboard'", output) != 0) {
    GTEST_SKIP() << "the tensorboard Python package is not importable with " << python << ": "
                 << output;
  }
  Harness first("{}");
  first.begin();
  for (std::int64_t step = 1; step <= 6; ++step) {
    StepMetrics m = metrics_of(step);
    m.extra["moe/layer0/maxvio"] = 0.5 * static_cast<double>(step);
    first.step_end(m);
    if (step == 2) first.eval_end(EvalMetrics{2, "val", {{"loss", 2.75}}});
    if (step == 6) first.eval_end(EvalMetrics{6, "val", {{"loss", 9.0}}});  // orphaned
  }
  first.end();

  // The resumed attempt writes into the same run directory.
  Harness second("{}");
  second.run.run_dir = first.run.run_dir;
  second.components = testing::build_components(
      "board: {component_key: callback, variant_key: tensorboard, config: {}}\n", second.run);
  second.board = testing::built<Callback>(second.components, "board");
  second.progress.step = 4;
  second.begin();
  for (std::int64_t step = 5; step <= 6; ++step) {
    StepMetrics m = metrics_of(step);
    m.loss = 100.0 + static_cast<double>(step);
    m.extra["moe/layer0/maxvio"] = 0.5 * static_cast<double>(step);
    second.step_end(m);
  }
  second.end();
  ASSERT_EQ(event_files(first.board_dir()).size(), 2u);

  const std::string script = first.dir.write("read_board.py", R"(
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})
acc.Reload()
out = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}
with open(sys.argv[2], 'w') as f:
    json.dump(out, f)
)");
  const std::string result = first.dir.file("scalars.json");
  ASSERT_EQ(testing::run_command("'" + python + "' '" + script + "' '" + first.board_dir().string() +
                                     "' '" + result + "'",
                                 output),
            0)
      << output;
  const nlohmann::json scalars = nlohmann::json::parse(read_file(result));

  using Points = std::vector<std::pair<std::int64_t, float>>;
  const auto points = [&](const std::string& tag) {
    Points p;
    for (const auto& e : scalars.at(tag)) p.emplace_back(e[0].get<std::int64_t>(), e[1].get<float>());
    return p;
  };
  EXPECT_EQ(points("train/loss"),
            (Points{{1, 2.75f}, {2, 2.5f}, {3, 2.25f}, {4, 2.0f}, {5, 105.0f}, {6, 106.0f}}));
  EXPECT_EQ(points("moe/layer0/maxvio"),
            (Points{{1, 0.5f}, {2, 1.0f}, {3, 1.5f}, {4, 2.0f}, {5, 2.5f}, {6, 3.0f}}));
  EXPECT_EQ(points("val/loss"), (Points{{2, 2.75f}}));  // step 6's was orphaned
  EXPECT_EQ(points("time/forward_backward_s"),
            (Points{{1, 0.375f}, {2, 0.375f}, {3, 0.375f}, {4, 0.375f}, {5, 0.375f}, {6, 0.375f}}));
  EXPECT_EQ(points("memory/peak_bytes").at(0), (std::pair<std::int64_t, float>{1, 3145728.0f}));
  EXPECT_EQ(scalars.size(), 15u) << scalars.dump();  // 13 step tags + the extra + val/loss
}

}  // namespace tensorboard_test
}  // namespace tessera
