// A plugin that claims an SDK ABI version the host does not have; the host must refuse it.
#include "tessera/plugin.hpp"

namespace {
void register_nothing(tessera::Registrar&) {}
}  // namespace

extern "C" __attribute__((visibility("default"))) const tessera::PluginInfo* tessera_plugin_entry() {
  static const tessera::PluginInfo info{999, "wrong_abi", "0.0.1", &register_nothing};
  return &info;
}
