// Memory counters: the CUDA caching allocator where LibTorch has CUDA and the device is a GPU,
// else the kernel's view of this process (/proc/self/status, /proc/self/clear_refs).
#include "tessera/run/memory_stats.hpp"

#include <malloc.h>
#include <unistd.h>

#include <fstream>
#include <string>

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tessera {
namespace {

MemoryStats host_stats() {
  MemoryStats s;
  s.source = "process_rss";
  // "VmHWM:   1234 kB" and "VmRSS: ..." lines of /proc/self/status, read in one pass.
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, 6, "VmHWM:") == 0) s.peak = std::stoll(line.substr(6)) * 1024;
    if (line.compare(0, 6, "VmRSS:") == 0) s.in_use = std::stoll(line.substr(6)) * 1024;
  }
  s.reserved = s.in_use;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  s.total = pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
  return s;
}

}  // namespace

bool built_with_cuda() {
#ifdef TESSERA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

MemoryStats memory_stats(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    MemoryStats s;
    s.source = "cuda_allocator";
    s.in_use = stats.allocated_bytes[all].current;
    s.peak = stats.allocated_bytes[all].peak;
    s.reserved = stats.reserved_bytes[all].current;
    s.total = static_cast<std::int64_t>(c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(index).second);
    return s;
  }
#endif
  (void)device;
  return host_stats();
}

void reset_peak_memory(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
    return;
  }
#endif
  (void)device;
  // "5" resets the peak resident set (VmHWM) to the current one; some sandboxes forbid it, and
  // then the peak stays the peak since the process started.
  std::ofstream("/proc/self/clear_refs") << "5";
}

std::int64_t release_cached_memory(const c10::Device& device) {
  const MemoryStats before = memory_stats(device);
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    const MemoryStats after = memory_stats(device);
    return before.reserved > after.reserved ? before.reserved - after.reserved : 0;
  }
#endif
  malloc_trim(0);
  const MemoryStats after = memory_stats(device);
  return before.in_use > after.in_use ? before.in_use - after.in_use : 0;
}

}  // namespace tessera
