// What a plugin was built with, as text the host reads from the plugin file before loading it:
// the SDK ABI version, the LibTorch version, the compiler and the C++ standard library's ABI.
// A plugin that differs from the host in any of them is refused with one line naming the file
// and both values, before any of its code (static initialisers included) runs.
//
// TESSERA_PLUGIN (tessera/plugin.hpp) places the record in the ELF section `.tessera_build`
// (`readelf -p .tessera_build libtessera_NAME.so` shows it). The TESSERA_BUILD_* macros may be
// defined before including this header only to build deliberately mismatched test plugins.
#pragma once

#include <torch/version.h>

#include <cstdint>

#include "tessera/version.hpp"

#define TESSERA_BUILD_STRINGIFY_(x) #x
#define TESSERA_BUILD_STRINGIFY(x) TESSERA_BUILD_STRINGIFY_(x)

#ifndef TESSERA_BUILD_SDK_ABI
#define TESSERA_BUILD_SDK_ABI TESSERA_SDK_ABI_VERSION
#endif

#ifndef TESSERA_BUILD_TORCH_VERSION
#define TESSERA_BUILD_TORCH_VERSION                                                        \
  TESSERA_BUILD_STRINGIFY(TORCH_VERSION_MAJOR) "." TESSERA_BUILD_STRINGIFY(TORCH_VERSION_MINOR) \
  "." TESSERA_BUILD_STRINGIFY(TORCH_VERSION_PATCH)
#endif

// Family and full version; the host compares family and major version (minor releases of one
// compiler keep its C++ ABI).
#ifndef TESSERA_BUILD_COMPILER
#if defined(__clang__)
#define TESSERA_BUILD_COMPILER                                                           \
  "clang " TESSERA_BUILD_STRINGIFY(__clang_major__) "." TESSERA_BUILD_STRINGIFY(__clang_minor__) \
  "." TESSERA_BUILD_STRINGIFY(__clang_patchlevel__)
#elif defined(__GNUC__)
#define TESSERA_BUILD_COMPILER                                                           \
  "gcc " TESSERA_BUILD_STRINGIFY(__GNUC__) "." TESSERA_BUILD_STRINGIFY(__GNUC_MINOR__) \
  "." TESSERA_BUILD_STRINGIFY(__GNUC_PATCHLEVEL__)
#else
#define TESSERA_BUILD_COMPILER "unknown"
#endif
#endif

// std::string and std::list change layout between libstdc++'s two ABIs; libc++ is another library.
#ifndef TESSERA_BUILD_STDLIB
#if defined(_LIBCPP_VERSION)
#define TESSERA_BUILD_STDLIB "libc++"
#elif defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI
#define TESSERA_BUILD_STDLIB "libstdc++ cxx11-abi"
#elif defined(__GLIBCXX__)
#define TESSERA_BUILD_STDLIB "libstdc++ pre-cxx11-abi"
#else
#define TESSERA_BUILD_STDLIB "unknown"
#endif
#endif

// "key=value" lines after a first line that names the format.
#define TESSERA_BUILD_RECORD                                              \
  "tessera-build-record 1\n"                                              \
  "sdk_abi=" TESSERA_BUILD_STRINGIFY(TESSERA_BUILD_SDK_ABI) "\n"          \
  "torch=" TESSERA_BUILD_TORCH_VERSION "\n"                               \
  "compiler=" TESSERA_BUILD_COMPILER "\n"                                 \
  "stdlib=" TESSERA_BUILD_STDLIB "\n"

namespace tessera {

// The ELF section TESSERA_PLUGIN writes the record into.
inline constexpr const char* kBuildRecordSection = ".tessera_build";

}  // namespace tessera
