// The `settings` and `plugins` sections of a run spec: what the whole run shares (seed, run
// directory, device, threads, timeouts, the MFU peak, logging) and where plugins are searched.
// Declared once (tessera/config/config_fields.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"

namespace tessera::core {

struct RunSettings {
  std::int64_t seed = 1234;
  std::optional<std::string> run_dir;  // absent: runs/NAME
  std::string device = "cpu";          // cpu, cuda or cuda:N
  bool deterministic = false;
  std::string precision = "fp32";  // fp32, or bf16: autocast compute over fp32 master weights
  bool tf32 = false;               // fp32 matrix products and convolutions on GPUs may use TF32
  std::int64_t num_threads = 0;
  double collective_timeout_s = 300.0;
  double peak_flops = 0.0;  // one device's peak FLOP/s for MFU; 0: the table of known GPUs
  std::string log_level = "info";

  std::chrono::milliseconds collective_timeout() const {
    return std::chrono::milliseconds(static_cast<std::int64_t>(collective_timeout_s * 1000));
  }
  static void declare(ConfigFields<RunSettings>& f);
};

struct PluginSettings {
  std::vector<std::string> paths;

  static void declare(ConfigFields<PluginSettings>& f);
};

}  // namespace tessera::core
