#include "tessera/formats/crc32c.hpp"

#include <array>
#include <fstream>
#include <vector>

#include "tessera/error.hpp"

namespace tessera {
namespace {

// Slicing-by-8 tables for the reflected Castagnoli polynomial 0x82F63B78.
const std::array<std::array<std::uint32_t, 256>, 8>& tables() {
  static const auto t = [] {
    std::array<std::array<std::uint32_t, 256>, 8> tab{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      tab[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i) {
      for (std::size_t s = 1; s < 8; ++s) tab[s][i] = (tab[s - 1][i] >> 8) ^ tab[0][tab[s - 1][i] & 0xFF];
    }
    return tab;
  }();
  return t;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
  const auto& t = tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (size >= 8) {
    const std::uint32_t lo = crc ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                    std::uint32_t(p[3]) << 24);
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    size -= 8;
  }
  while (size--) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t file_crc32c(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::vector<char> buffer(1 << 20);
  std::uint32_t crc = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    crc = crc32c(buffer.data(), static_cast<std::size_t>(in.gcount()), crc);
  }
  if (in.bad()) throw Error("error reading " + path);
  return crc;
}

}  // namespace tessera
