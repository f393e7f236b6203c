// How much memory this process holds: the CUDA caching allocator's counters on a GPU, the
// resident set from /proc/self/status on a CPU. Used by the trainer's step metrics and by the
// memory_monitor and gc callbacks; querying a CPU never initialises CUDA.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "tessera/export.hpp"

namespace tessera {

struct MemoryStats {
  const char* source = "";    // "cuda_allocator" or "process_rss"
  std::int64_t in_use = 0;    // CUDA: bytes in live tensors; CPU: resident set size
  std::int64_t peak = 0;      // highest in_use since the last reset_peak_memory (CPU: peak RSS)
  std::int64_t reserved = 0;  // CUDA: held by the caching allocator; CPU: resident set size
  std::int64_t total = 0;     // the device's memory (CPU: physical memory); 0 when unknown
};

TESSERA_API MemoryStats memory_stats(const c10::Device& device);
// Starts a new peak window (CUDA: the allocator's peak; CPU: the kernel's VmHWM, where allowed).
TESSERA_API void reset_peak_memory(const c10::Device& device);
// Gives cached, unused memory back: the CUDA allocator's cache on a GPU, malloc's free pages
// (malloc_trim) on the host. Returns the bytes the process held less afterwards (>= 0).
TESSERA_API std::int64_t release_cached_memory(const c10::Device& device);
// Whether this LibTorch was built with CUDA (the SDK then reads the CUDA allocator).
TESSERA_API bool built_with_cuda();

}  // namespace tessera
