// A plugin built against an SDK ABI version the host does not have; the host must refuse it.
#define TESSERA_BUILD_SDK_ABI 999
#include "tessera/plugin.hpp"

namespace {
void register_nothing(tessera::Registrar&) {}
}  // namespace

TESSERA_PLUGIN("wrong_abi", "0.0.1", register_nothing)
