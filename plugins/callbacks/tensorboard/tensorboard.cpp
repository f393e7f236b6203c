// Callback `tensorboard`: writes the step metrics and evaluation results as scalars to a
// TensorBoard event file (TFRecord-framed Event protos) under the run directory. Rank 0 only.
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "event_encoding.hpp"
#include "tessera/components/callback.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

namespace fs = std::filesystem;
using Scalars = std::vector<std::pair<std::string, float>>;

double unix_time_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TFRecord's masked CRC-32C: a CRC of data that itself holds CRCs stays well distributed.
std::uint32_t masked_crc(const void* data, std::size_t size) {
  const std::uint32_t crc = tessera::crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(char* out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

// events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, the name TensorBoard's writers use; n
// counts up past files that exist (a resume within the same second), keeping names in order.
fs::path new_event_file(const fs::path& dir) {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) std::strcpy(host.data(), "localhost");
  const std::string stem = "events.out.tfevents." +
                           std::to_string(static_cast<std::int64_t>(unix_time_s())) + "." +
                           host.data() + "." + std::to_string(::getpid()) + ".";
  for (int n = 0;; ++n) {
    fs::path path = dir / (stem + std::to_string(n));
    if (!fs::exists(path)) return path;
  }
}

struct TensorBoardConfig {
  std::string dir = "tensorboard";
  std::int64_t every = 1;
  double flush_every_s = 10.0;

  static void declare(tessera::ConfigFields<TensorBoardConfig>& f) {
    using C = TensorBoardConfig;
    f.field("dir", &C::dir, "folder of the event file, relative to the run directory unless absolute");
    f.field("every", &C::every, "write the step scalars every N optimizer steps").at_least(1);
    f.field("flush_every_s", &C::flush_every_s, "flush the file at most this many seconds after a write").at_least(0);
  }
};

class TensorBoard final : public tessera::Callback {
 public:
  TensorBoard(const TensorBoardConfig& config, const tessera::RunContext& run)
      : every_(config.every), flush_every_s_(config.flush_every_s), dir_(tessera::in_run_dir(run, config.dir)) {}

  void on_train_begin(tessera::CallbackContext& ctx) override {
    if (ctx.run.rank != 0) return;
    fs::create_directories(dir_);
    // An earlier attempt's event file in the folder (a run started again from step 0, e.g. a
    // crash before its first checkpoint): the restart marker tells readers to drop its steps.
    bool earlier_attempt = false;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      earlier_attempt = earlier_attempt || entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    }
    path_ = new_event_file(dir_);
    out_.open(path_, std::ios::out | std::ios::binary | std::ios::trunc);
    if (!out_) throw tessera::Error("callback/tensorboard: cannot open " + path_.string());
    write_record(tessera::tensorboard::file_version_event(unix_time_s(), "brain.Event:2"));
    if (ctx.progress.step > 0 || earlier_attempt) mark_restart(ctx.progress.step);
    flush();
    tessera::log::info("tensorboard: writing ", path_.string());
  }

  void on_checkpoint_loaded(tessera::CallbackContext& ctx,
                            const tessera::CheckpointEvent& event) override {
    if (ctx.run.rank != 0 || !out_.is_open() || event.step <= 0) return;
    mark_restart(event.step);
  }

  // A step's scalars are written once its loss has arrived from the device: at once on a CPU, a
  // step later on a GPU, so the sink never makes the host wait for the device (as jsonl_metrics).
  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics& m) override {
    if (ctx.run.rank != 0 || !out_.is_open()) return;
    write_pending();
    if (m.step % every_ != 0) return;
    if (arrived(m)) {
      write_step(m);
    } else {
      pending_ = m;
    }
  }

  void on_evaluation_end(tessera::CallbackContext& ctx, const tessera::EvalMetrics& m) override {
    if (ctx.run.rank != 0 || !out_.is_open()) return;
    write_pending();
    Scalars scalars;
    for (const auto& [key, value] : m.values) {
      scalars.emplace_back(m.name + "/" + key, static_cast<float>(value));
    }
    write_record(tessera::tensorboard::scalars_event(unix_time_s(), m.step, scalars));
    flush();  // evaluations are rare, and the last may come after on_train_end
  }

  // The file stays open until the callback goes: a callback listed after this one may still
  // announce a final evaluation from its own on_train_end.
  void on_train_end(tessera::CallbackContext&) override {
    write_pending();
    flush();
  }
  // A failing run's pending step only if it has arrived: waiting on a failed device could hang.
  void on_exception(tessera::CallbackContext&, const std::string&) override {
    if (pending_ && !arrived(*pending_)) pending_.reset();
    write_pending();
    flush();
  }

 private:
  static bool arrived(const tessera::StepMetrics& m) { return m.loss.ready() && m.grad_norm.ready(); }

  void write_pending() {
    if (!pending_) return;
    write_step(*pending_);
    pending_.reset();
  }

  void write_step(const tessera::StepMetrics& m) {
    Scalars scalars;
    const auto add = [&scalars](const std::string& tag, double value) {
      scalars.emplace_back(tag, static_cast<float>(value));  // NaN and Inf are kept as they are
    };
    add("train/loss", m.loss);
    add("train/grad_norm", m.grad_norm);
    add("train/lr", m.lr);
    add("train/tokens_per_s", m.tokens_per_s);
    add("train/tokens_per_s_per_device", m.tokens_per_s_per_device);
    if (m.mfu) add("train/mfu", *m.mfu);
    add("time/step_s", m.step_time_s);
    add("time/data_s", m.time_data_s);
    add("time/forward_backward_s", m.time_forward_backward_s);
    add("time/optimizer_s", m.time_optimizer_s);
    add("time/communication_s", m.time_communication_s);
    add("memory/in_use_bytes", static_cast<double>(m.memory_in_use_bytes));
    add("memory/peak_bytes", static_cast<double>(m.memory_peak_bytes));
    add("memory/reserved_bytes", static_cast<double>(m.memory_reserved_bytes));
    for (const auto& [tag, value] : m.extra) add(tag, value);
    write_record(tessera::tensorboard::scalars_event(unix_time_s(), m.step, scalars));
    maybe_flush();
  }

  // A run continued from a checkpoint at `step` (steps done): an earlier attempt may have
  // logged later steps before it died. SessionLog START at the first new step makes TensorBoard
  // drop every point of the earlier attempt at that step or later, and keep the ones before.
  void mark_restart(std::int64_t step) {
    if (restart_marked_) return;
    restart_marked_ = true;
    write_record(tessera::tensorboard::session_start_event(unix_time_s(), step + 1));
  }

  // TFRecord framing: length (uint64 LE), masked CRC of the length, data, masked CRC of data.
  void write_record(const std::string& data) {
    char header[12];
    put_le(header, data.size(), 8);
    put_le(header + 8, masked_crc(header, 8), 4);
    char footer[4];
    put_le(footer, masked_crc(data.data(), data.size()), 4);
    out_.write(header, sizeof header);
    out_.write(data.data(), static_cast<std::streamsize>(data.size()));
    out_.write(footer, sizeof footer);
    if (!out_) throw tessera::Error("callback/tensorboard: cannot write " + path_.string());
  }

  void maybe_flush() {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush_).count() >=
        flush_every_s_) {
      flush();
    }
  }

  void flush() {
    if (!out_.is_open()) return;
    out_.flush();
    last_flush_ = std::chrono::steady_clock::now();
  }

  std::int64_t every_;
  double flush_every_s_;
  fs::path dir_;
  fs::path path_;
  std::ofstream out_;
  bool restart_marked_ = false;
  std::optional<tessera::StepMetrics> pending_;  // a step whose loss was still on its way
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, TensorBoardConfig>(
      "tensorboard", "step metrics and evaluations as TensorBoard scalars, rank 0 only",
      [](const TensorBoardConfig& c, const tessera::RunContext& run) { return std::make_shared<TensorBoard>(c, run); });
}

}  // namespace

TESSERA_PLUGIN("callback_tensorboard", "0.1.0", register_components)
