// Callback `memory_monitor`: every N steps, every rank's memory as the trainer measured it for
// the step (CUDA allocator or process RSS), gathered across ranks: the largest and smallest peak,
// in use and reserved, written to the sinks as memory/* metrics; rank 0 logs a line and warns
// when the largest peak nears the device's (or host's) capacity.
#include <ATen/ops/tensor.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/log.hpp"
#include "tessera/run/memory_stats.hpp"
#include "tessera/plugin.hpp"

namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

struct MemoryMonitorConfig {
  std::int64_t every = 10;
  double warn_fraction = 0.9;

  static void declare(tessera::ConfigFields<MemoryMonitorConfig>& f) {
    f.field("every", &MemoryMonitorConfig::every, "measure every N steps (and at step 1)").at_least(1);
    f.field("warn_fraction", &MemoryMonitorConfig::warn_fraction,
            "warn when the fullest rank's peak exceeds this fraction of its memory")
        .greater_than(0)
        .at_most(1);
  }
};

class MemoryMonitor final : public tessera::Callback {
 public:
  explicit MemoryMonitor(const MemoryMonitorConfig& config) : every_(config.every), warn_fraction_(config.warn_fraction) {}

  void on_collect_metrics(tessera::CallbackContext& ctx, tessera::StepMetrics& m) override {
    if (m.step % every_ != 0 && m.step != 1) return;
    // The trainer measured this rank's memory for the step already; only the capacity, which
    // does not change, is asked for, once.
    if (!capacity_) capacity_ = tessera::memory_stats(c10::Device(ctx.run.device));
    // Maxima and, negated, minima in one collective.
    at::Tensor v = at::tensor({m.memory_peak_bytes, m.memory_in_use_bytes, m.memory_reserved_bytes,
                               -m.memory_peak_bytes, capacity_->total},
                              at::kLong);
    if (ctx.run.communicator && ctx.run.communicator->world_size() > 1) {
      ctx.run.communicator->all_reduce(v, tessera::ReduceOp::max);
    }
    const double max_peak = static_cast<double>(v[0].item<std::int64_t>());
    const double min_peak = static_cast<double>(-v[3].item<std::int64_t>());
    const double total = static_cast<double>(v[4].item<std::int64_t>());
    m.extra["memory/max_rank_peak_bytes"] = max_peak;
    m.extra["memory/min_rank_peak_bytes"] = min_peak;
    m.extra["memory/max_rank_in_use_bytes"] = static_cast<double>(v[1].item<std::int64_t>());
    m.extra["memory/max_rank_reserved_bytes"] = static_cast<double>(v[2].item<std::int64_t>());
    if (total > 0) m.extra["memory/max_rank_peak_fraction"] = max_peak / total;
    if (ctx.run.rank != 0) return;
    tessera::log::info("memory at step ", m.step, " (", capacity_->source, "): peak ", gib(max_peak), " on the fullest rank, ",
                       gib(min_peak), " on the emptiest", total > 0 ? " of " + gib(total) : std::string());
    if (total > 0 && max_peak / total > warn_fraction_) {
      tessera::log::warn("memory: the fullest rank peaked at ", 100.0 * max_peak / total, "% of ", gib(total),
                         " (warn_fraction ", warn_fraction_, "); a larger step may run out of memory");
    }
  }

 private:
  std::int64_t every_;
  double warn_fraction_;
  std::optional<tessera::MemoryStats> capacity_;  // source and total of this rank's memory
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, MemoryMonitorConfig>(
      "memory_monitor", "every rank's memory peak, in use and reserved, across ranks, every N steps",
      [](const MemoryMonitorConfig& c) { return std::make_shared<MemoryMonitor>(c); });
}

}  // namespace

TESSERA_PLUGIN("callback_memory_monitor", "0.1.0", register_components)
