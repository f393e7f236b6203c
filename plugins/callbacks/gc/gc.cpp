// Callback `gc`: every N steps gives memory that is cached but unused back — the CUDA caching
// allocator's free blocks on a GPU (emptyCache), malloc's free pages on the host (malloc_trim).
// Long runs with changing shapes fragment both; giving memory back costs a little speed, so the
// period is the user's choice. The bytes released are reported as gc/released_bytes.
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "tessera/components/callback.hpp"
#include "tessera/log.hpp"
#include "tessera/run/memory_stats.hpp"
#include "tessera/plugin.hpp"

namespace {

struct GcConfig {
  std::int64_t every = 100;
  bool host = true;

  static void declare(tessera::ConfigFields<GcConfig>& f) {
    f.field("every", &GcConfig::every, "release cached memory every N steps").at_least(1);
    f.field("host", &GcConfig::host, "on a GPU, also trim the host heap");
  }
};

class Gc final : public tessera::Callback {
 public:
  explicit Gc(const GcConfig& config) : every_(config.every), host_(config.host) {}

  void on_collect_metrics(tessera::CallbackContext& ctx, tessera::StepMetrics& m) override {
    if (m.step % every_ != 0) return;
    const c10::Device device(ctx.run.device);
    std::int64_t released = tessera::release_cached_memory(device);
    // On a GPU the host's heap is trimmed too when asked.
    if (host_ && device.is_cuda()) released += tessera::release_cached_memory(c10::Device(c10::kCPU));
    m.extra["gc/released_bytes"] = static_cast<double>(released);
    tessera::log::debug("gc at step ", m.step, ": released ", released, " bytes");
  }

 private:
  std::int64_t every_;
  bool host_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, GcConfig>("gc", "empties the CUDA cache / trims host memory every N steps",
                                             [](const GcConfig& c) { return std::make_shared<Gc>(c); });
}

}  // namespace

TESSERA_PLUGIN("callback_gc", "0.1.0", register_components)
