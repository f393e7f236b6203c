// The one entry point a plugin exports. The host dlopens the file, looks up
// `tessera_plugin_entry`, checks abi_version against its own, then calls register_components.
//
//   static void register_components(tessera::Registrar& r) { r.add<tessera::Scheduler>(...); }
//   TESSERA_PLUGIN("my_scheduler", "1.0.0", register_components)
#pragma once

#include <cstdint>

#include "tessera/registry.hpp"
#include "tessera/version.hpp"

namespace tessera {

// Plain C layout; abi_version comes first so any future layout can still be recognised.
struct PluginInfo {
  std::uint32_t abi_version;
  const char* name;
  const char* version;
  void (*register_components)(Registrar& registrar);
};

inline constexpr const char* kPluginEntrySymbol = "tessera_plugin_entry";
using PluginEntryFn = const PluginInfo*();

}  // namespace tessera

#define TESSERA_PLUGIN(NAME, VERSION, REGISTER_FN)                                      \
  extern "C" __attribute__((visibility("default"))) const ::tessera::PluginInfo*        \
  tessera_plugin_entry() {                                                              \
    static const ::tessera::PluginInfo info{::tessera::kSdkAbiVersion, NAME, VERSION,   \
                                            &REGISTER_FN};                              \
    return &info;                                                                       \
  }
