#include "tessera/run/precision.hpp"

#include <ATen/autocast_mode.h>

#include "tessera/error.hpp"

namespace tessera {

at::ScalarType compute_dtype(const std::string& precision) {
  if (precision == "fp32") return at::kFloat;
  if (precision == "bf16") return at::kBFloat16;
  throw Error("unknown precision \"" + precision + "\": use fp32 or bf16");
}

bool cpu_has_fast_bf16_matmul() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return true;  // no check elsewhere: assume the platform's bf16 units (ARM's BF16 extension)
#endif
}

AutocastGuard::AutocastGuard(const c10::Device& device, at::ScalarType dtype) : type_(device.type()) {
  if (dtype == at::kFloat) return;
  active_ = true;
  was_enabled_ = at::autocast::is_autocast_enabled(type_);
  was_dtype_ = at::autocast::get_autocast_dtype(type_);
  at::autocast::set_autocast_enabled(type_, true);
  at::autocast::set_autocast_dtype(type_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Leaving the outermost autocast scope drops the casts it cached (the bf16 copies of the
  // weights), as Python's torch.autocast does: the next step sees the updated weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, was_enabled_);
  at::autocast::set_autocast_dtype(type_, was_dtype_);
}

NoAutocast::NoAutocast(const c10::Device& device)
    : type_(device.type()), was_enabled_(at::autocast::is_autocast_enabled(type_)) {
  at::autocast::set_autocast_enabled(type_, false);
}

NoAutocast::~NoAutocast() { at::autocast::set_autocast_enabled(type_, was_enabled_); }

}  // namespace tessera
