// Whether the SDK's AVX2 kernels may run here (avx2_math.hpp).
#include "avx2_math.hpp"

namespace tessera::avx2 {

bool cpu_supported() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace tessera::avx2
