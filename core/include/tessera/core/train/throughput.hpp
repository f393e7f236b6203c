// Model FLOPs utilisation: which peak FLOP/s a device has at the precision the model computes
// in, from the configuration or a table of known GPUs (never a guessed default), and the ETA.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::core {

enum class ComputePrecision { fp32, tf32, bf16, fp16 };
const char* to_string(ComputePrecision precision);

// Dense peak FLOP/s of one GPU from its CUDA product name ("NVIDIA H100 80GB HBM3"): H100 (SXM,
// PCIe, NVL), H200 (SXM, NVL) and A100. nullopt for any other device.
std::optional<double> known_peak_flops(const std::string& device_name, ComputePrecision precision);

// What MFU is measured against: settings.peak_flops when set (> 0), else the table.
struct PeakFlops {
  std::optional<double> flops;  // per device
  std::string source;           // "settings.peak_flops", "table: NAME, bf16", or why there is none
};
PeakFlops resolve_peak_flops(double configured, const std::string& device_name, ComputePrecision precision);

// The product name of a CUDA device, "cpu" for the host.
std::string device_name(const c10::Device& device);

// The training FLOPs per token of a model whose base adapters froze. `model_flops` is the model's
// own count at the run's sequence length, 6 N plus attention (PaLM's convention), and
// `model_flops_at_zero` the count at sequence length 0, its 6 N. A frozen parameter still costs
// its forward (2) and the gradient of its input (2) but no weight gradient (2): the
// `frozen_share` of N (by elements) costs 4 instead of 6. Each of the `added_parameters` (an
// adapter's own, outside N) costs the 6 of a trained parameter.
double adapted_flops_per_token(double model_flops, double model_flops_at_zero, double frozen_share,
                               double added_parameters);

// model FLOPs per token x tokens/s on one device / that device's peak FLOP/s.
double model_flops_utilisation(double flops_per_token, double tokens_per_s_per_device, double peak_flops);

// Seconds until the first of the run's limits is reached (0 = no such limit), extrapolating the
// rates seen so far in this process; nullopt when the run has no limit or no rate is known yet.
struct EtaInputs {
  std::int64_t step = 0, max_steps = 0;
  std::int64_t tokens = 0, max_tokens = 0;
  double elapsed_s = 0, max_time_s = 0;
  double seconds_per_step = 0;  // mean over this process's steps
  double tokens_per_s = 0;      // mean over this process's steps
};
std::optional<double> estimate_eta(const EtaInputs& in);

}  // namespace tessera::core
