#include "tessera/core/train/throughput.hpp"

#include <algorithm>
#include <array>
#include <cctype>

#ifdef TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#endif

namespace tessera::core {
namespace {

struct GpuPeak {
  const char* family;   // matched in the product name
  const char* variant;  // a second part that must also appear ("" matches any)
  double bf16, tf32, fp32;  // dense FLOP/s (fp16 = bf16 on these parts)
};

// NVIDIA's datasheets, dense (no sparsity). More specific variants first.
constexpr std::array<GpuPeak, 7> kGpuPeaks{{
    {"H200", "NVL", 835.5e12, 417.5e12, 60.0e12},
    {"H200", "", 989.4e12, 494.7e12, 66.9e12},
    {"H100", "NVL", 835.5e12, 417.5e12, 60.0e12},
    {"H100", "PCIE", 756.0e12, 378.0e12, 51.2e12},
    {"H100", "", 989.4e12, 494.7e12, 66.9e12},  // SXM5 ("NVIDIA H100 80GB HBM3")
    {"A100", "", 312.0e12, 156.0e12, 19.5e12},
    {"GH200", "", 989.4e12, 494.7e12, 66.9e12},
}};

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

}  // namespace

const char* to_string(ComputePrecision precision) {
  switch (precision) {
    case ComputePrecision::fp32: return "fp32";
    case ComputePrecision::tf32: return "tf32";
    case ComputePrecision::bf16: return "bf16";
    case ComputePrecision::fp16: return "fp16";
  }
  return "?";
}

std::optional<double> known_peak_flops(const std::string& device_name, ComputePrecision precision) {
  const std::string name = upper(device_name);
  // A MIG slice ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") has a fraction of the GPU's peak.
  if (name.find("MIG") != std::string::npos) return std::nullopt;
  for (const GpuPeak& gpu : kGpuPeaks) {
    if (name.find(gpu.family) == std::string::npos) continue;
    if (*gpu.variant && name.find(gpu.variant) == std::string::npos) continue;
    switch (precision) {
      case ComputePrecision::bf16:
      case ComputePrecision::fp16: return gpu.bf16;
      case ComputePrecision::tf32: return gpu.tf32;
      case ComputePrecision::fp32: return gpu.fp32;
    }
  }
  return std::nullopt;
}

PeakFlops resolve_peak_flops(double configured, const std::string& device_name, ComputePrecision precision) {
  if (configured > 0) return {configured, "settings.peak_flops"};
  if (auto peak = known_peak_flops(device_name, precision)) {
    return {peak, "table: " + device_name + ", " + to_string(precision)};
  }
  return {std::nullopt, "no peak FLOP/s is known for '" + device_name + "' (" + to_string(precision) +
                            "); set settings.peak_flops to report MFU"};
}

std::string device_name(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0)->name;
#endif
  return device.str();
}

double adapted_flops_per_token(double model_flops, double model_flops_at_zero, double frozen_share,
                               double added_parameters) {
  return model_flops - model_flops_at_zero / 3.0 * frozen_share + 6.0 * added_parameters;
}

double model_flops_utilisation(double flops_per_token, double tokens_per_s_per_device, double peak_flops) {
  return peak_flops > 0 ? flops_per_token * tokens_per_s_per_device / peak_flops : 0.0;
}

std::optional<double> estimate_eta(const EtaInputs& in) {
  std::optional<double> eta;
  auto consider = [&eta](double seconds) { eta = eta ? std::min(*eta, seconds) : seconds; };
  if (in.max_steps > 0 && in.seconds_per_step > 0) {
    consider(static_cast<double>(std::max<std::int64_t>(in.max_steps - in.step, 0)) * in.seconds_per_step);
  }
  if (in.max_tokens > 0 && in.tokens_per_s > 0) {
    consider(static_cast<double>(std::max<std::int64_t>(in.max_tokens - in.tokens, 0)) / in.tokens_per_s);
  }
  if (in.max_time_s > 0) consider(std::max(in.max_time_s - in.elapsed_s, 0.0));
  return eta;
}

}  // namespace tessera::core
