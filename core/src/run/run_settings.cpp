#include "tessera/core/run/run_settings.hpp"

namespace tessera::core {
namespace {

bool valid_device(const std::string& d) {
  if (d == "cpu" || d == "cuda") return true;
  if (d.rfind("cuda:", 0) != 0 || d.size() == 5) return false;
  return d.find_first_not_of("0123456789", 5) == std::string::npos;
}

}  // namespace

void RunSettings::declare(ConfigFields<RunSettings>& f) {
  using S = RunSettings;
  f.field("seed", &S::seed, "the one seed every RNG derives from").at_least(0);
  f.field("run_dir", &S::run_dir, "where the run writes its files (default runs/NAME)");
  f.field("device", &S::device, "cpu, cuda or cuda:N; CUDA is touched only when asked for");
  f.field("deterministic", &S::deterministic, "use only deterministic LibTorch kernels");
  f.field("precision", &S::precision,
          "fp32, or bf16: forward and backward compute in bfloat16 (autocast) while parameters, gradients and "
          "optimizer state stay float32")
      .one_of({"fp32", "bf16"});
  f.field("tf32", &S::tf32, "let float32 matrix products and convolutions on GPUs use TF32 tensor cores");
  f.field("num_threads", &S::num_threads, "intra-op CPU threads (0: LibTorch's default)").at_least(0).at_most(4096);
  // At most a week: the timeout becomes milliseconds on a steady clock and in c10d's options.
  f.field("collective_timeout_s", &S::collective_timeout_s, "a collective waiting longer for another rank fails the run")
      .greater_than(0)
      .at_most(7 * 24 * 3600);
  f.field("peak_flops", &S::peak_flops,
          "one device's peak FLOP/s for MFU (0: from the table of known GPUs: H100, H200, A100)")
      .at_least(0);
  f.field("log_level", &S::log_level, "trace, debug, info, warn or error")
      .one_of({"trace", "debug", "info", "warn", "error"});
  f.check([](const S& s) {
    if (!valid_device(s.device)) throw ConfigError("expected cpu, cuda or cuda:N, got \"" + s.device + "\"", "device");
  });
}

void PluginSettings::declare(ConfigFields<PluginSettings>& f) {
  f.field("paths", &PluginSettings::paths, "directories searched for plugins first").existing_path();
}

}  // namespace tessera::core
