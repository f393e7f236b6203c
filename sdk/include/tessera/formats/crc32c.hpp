// CRC-32C (Castagnoli), the checksum of checkpoint files (and of TFRecord framing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/export.hpp"

namespace tessera {

// Continues `crc` (0 to start) over `size` bytes.
TESSERA_API std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);
// The CRC-32C of a whole file; throws tessera::Error when it cannot be read.
TESSERA_API std::uint32_t file_crc32c(const std::string& path);

}  // namespace tessera
