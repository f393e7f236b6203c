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

#include "tessera/callback.hpp"
#include "tessera/crc32c.hpp"
#include "tessera/model.hpp"
#include "callback_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// ---- A TFRecord reader and an Event decoder --------------------------------------------

std::uint32_t masked_crc(const char* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::uint64_t read_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Splits a TFRecord file into its records' data; throws naming the record whose framing or
// checksums are wrong.
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    const std::string where = "record " + std::to_string(records.size());
    if (bytes.size() - at < 12) throw std::runtime_error(where + ": truncated header");
    const char* header = bytes.data() + at;
    if (static_cast<std::uint32_t>(read_le(header + 8, 4)) != masked_crc(header, 8)) {
      throw std::runtime_error(where + ": length CRC mismatch");
    }
    const std::uint64_t length = read_le(header, 8);
    if (bytes.size() - at - 12 < length + 4) throw std::runtime_error(where + ": truncated data");
    const char* data = header + 12;
    if (static_cast<std::uint32_t>(read_le(data + length, 4)) != masked_crc(data, length)) {
      throw std::runtime_error(where + ": data CRC mismatch");
    }
    records.emplace_back(data, length);
    at += 12 + length + 4;
  }
  return records;
}

// What read_records throws for `bytes`, or "" when they read cleanly.
std::string framing_error(const std::string& bytes) {
  try {
    read_records(bytes);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// Protobuf wire format: enough to read Event, Summary, Summary.Value and SessionLog.
class WireReader {
 public:
  // Keeps its own copy: nested messages are read from temporaries.
  explicit WireReader(std::string bytes)
      : bytes_(std::move(bytes)), p_(bytes_.data()), end_(p_ + bytes_.size()) {}
  bool done() const { return p_ == end_; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto byte = static_cast<unsigned char>(*p_++);
      v |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    throw std::runtime_error("varint too long");
  }
  std::string bytes(std::size_t n) {
    need(n);
    std::string out(p_, n);
    p_ += n;
    return out;
  }
  std::string length_delimited() { return bytes(varint()); }
  void skip(int wire_type) {
    if (wire_type == 0) varint();
    else if (wire_type == 1) bytes(8);
    else if (wire_type == 2) length_delimited();
    else if (wire_type == 5) bytes(4);
    else throw std::runtime_error("unsupported wire type " + std::to_string(wire_type));
  }

 private:
  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end_ - p_) < n) throw std::runtime_error("truncated message");
  }
  std::string bytes_;
  const char* p_;
  const char* end_;
};

struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::optional<std::string> file_version;
  std::optional<std::vector<std::pair<std::string, float>>> scalars;  // Summary.value
  std::optional<std::int64_t> session_status;                        // SessionLog.status
};

std::vector<std::pair<std::string, float>> decode_summary(const std::string& bytes) {
  std::vector<std::pair<std::string, float>> values;
  WireReader summary(bytes);
  while (!summary.done()) {
    const std::uint64_t key = summary.varint();
    if (key != (1 << 3 | 2)) {  // Summary.value
      summary.skip(static_cast<int>(key & 7));
      continue;
    }
    WireReader value(summary.length_delimited());
    std::string tag;
    std::optional<float> simple;
    while (!value.done()) {
      const std::uint64_t k = value.varint();
      if (k == (1 << 3 | 2)) {
        tag = value.length_delimited();
      } else if (k == (2 << 3 | 5)) {
        const std::string raw = value.bytes(4);
        const auto bits = static_cast<std::uint32_t>(read_le(raw.data(), 4));
        float f;
        std::memcpy(&f, &bits, 4);
        simple = f;
      } else {
        value.skip(static_cast<int>(k & 7));
      }
    }
    if (!simple) throw std::runtime_error("summary value " + tag + " has no simple_value");
    values.emplace_back(tag, *simple);
  }
  return values;
}

Event decode_event(const std::string& bytes) {
  Event event;
  WireReader in(bytes);
  while (!in.done()) {
    const std::uint64_t key = in.varint();
    const auto field = key >> 3;
    const auto wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 1) {
      const std::string raw = in.bytes(8);
      const std::uint64_t bits = read_le(raw.data(), 8);
      std::memcpy(&event.wall_time, &bits, 8);
    } else if (field == 2 && wire == 0) {
      event.step = static_cast<std::int64_t>(in.varint());
    } else if (field == 3 && wire == 2) {
      event.file_version = in.length_delimited();
    } else if (field == 5 && wire == 2) {
      event.scalars = decode_summary(in.length_delimited());
    } else if (field == 7 && wire == 2) {  // session_log (6 is the old log_message)
      WireReader log(in.length_delimited());
      event.session_status = 0;
      while (!log.done()) {
        const std::uint64_t k = log.varint();
        if (k == (1 << 3 | 0)) event.session_status = static_cast<std::int64_t>(log.varint());
        else log.skip(static_cast<int>(k & 7));
      }
    } else {
      in.skip(wire);
    }
  }
  return event;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<Event> read_events(const fs::path& file) {
  std::vector<Event> events;
  for (const std::string& record : read_records(read_file(file))) events.push_back(decode_event(record));
  return events;
}

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

}  // namespace
}  // namespace tessera
