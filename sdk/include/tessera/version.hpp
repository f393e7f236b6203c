// Versions a plugin is checked against. The SDK ABI version changes whenever a type that crosses
// the host/plugin boundary changes layout or meaning; the host refuses plugins built against
// another. It cannot slip: the build fails when the public headers differ from the hash recorded
// for this version in sdk/abi_versions.txt (cmake/SdkAbi.cmake).
#pragma once

#include <cstdint>

#include "tessera/export.hpp"

#define TESSERA_VERSION_STRING "0.1.0"
// A macro as well, so a plugin's build record (tessera/build_record.hpp) can spell it as text.
#define TESSERA_SDK_ABI_VERSION 24

namespace tessera {

inline constexpr std::uint32_t kSdkAbiVersion = TESSERA_SDK_ABI_VERSION;

// The version of the SDK library actually loaded (may differ from the headers a plugin saw).
TESSERA_API const char* sdk_version();
TESSERA_API std::uint32_t sdk_abi_version();

}  // namespace tessera
