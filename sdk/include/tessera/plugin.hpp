// The one entry point a plugin exports. The host first reads the plugin's build record from the
// file (tessera/build_record.hpp) and refuses a mismatch without loading it; then it dlopens the
// file, looks up `tessera_plugin_entry` and calls register_components.
//
//   static void register_components(tessera::Registrar& r) { r.add<tessera::Scheduler, MyConfig>(...); }
//   TESSERA_PLUGIN("my_scheduler", "1.0.0", register_components)
#pragma once

#include <cstdint>

#include "tessera/build_record.hpp"
#include "tessera/registry.hpp"
#include "tessera/version.hpp"

namespace tessera {

// Plain C layout; abi_version comes first so any future layout can still be recognised.
struct PluginInfo {
  std::uint32_t abi_version;
  const char* name;
  const char* version;
  void (*register_components)(Registrar& registrar);
  const char* build_record;  // the same text as the file's build-record section
};

inline constexpr const char* kPluginEntrySymbol = "tessera_plugin_entry";
using PluginEntryFn = const PluginInfo*();

}  // namespace tessera

// The build record alone (TESSERA_PLUGIN includes it). `used`, and the entry's pointer to it,
// keep the compiler and the linker from dropping the section.
#define TESSERA_PLUGIN_BUILD_RECORD()                                                    \
  extern "C" __attribute__((used, section(".tessera_build"))) const char                \
      tessera_plugin_build_record[] = TESSERA_BUILD_RECORD;

#define TESSERA_PLUGIN(NAME, VERSION, REGISTER_FN)                                      \
  TESSERA_PLUGIN_BUILD_RECORD()                                                         \
  extern "C" __attribute__((visibility("default"))) const ::tessera::PluginInfo*        \
  tessera_plugin_entry() {                                                              \
    static const ::tessera::PluginInfo info{TESSERA_BUILD_SDK_ABI, NAME, VERSION,       \
                                            &REGISTER_FN, tessera_plugin_build_record}; \
    return &info;                                                                       \
  }
