// Versions a plugin is checked against. kSdkAbiVersion changes whenever a type that crosses the
// host/plugin boundary changes layout or meaning; the host refuses plugins built against another.
#pragma once

#include <cstdint>

#include "tessera/export.hpp"

#define TESSERA_VERSION_STRING "0.1.0"

namespace tessera {

inline constexpr std::uint32_t kSdkAbiVersion = 3;

// The version of the SDK library actually loaded (may differ from the headers a plugin saw).
TESSERA_API const char* sdk_version();
TESSERA_API std::uint32_t sdk_abi_version();

}  // namespace tessera
