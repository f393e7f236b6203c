// A plugin's build record (tessera/build_record.hpp) read straight from its ELF file, without
// loading it, and compared with the host's own: the SDK ABI version, LibTorch, the compiler and
// the C++ standard library's ABI must all match before any of the plugin's code may run.
#pragma once

#include <optional>
#include <string>

namespace tessera::core {

struct BuildRecord {
  std::string format;  // the first line: "tessera-build-record 1"
  std::string sdk_abi;
  std::string torch;
  std::string compiler;  // "gcc 12.2.0"
  std::string stdlib;    // "libstdc++ cxx11-abi"
};

// The record this host was built with.
const BuildRecord& host_build_record();

// Parses the record's text; missing keys stay empty.
BuildRecord parse_build_record(const std::string& text);

// The text of the `.tessera_build` section of the ELF file at `path`; nullopt when the file has
// no such section. Throws tessera::Error when the file cannot be read or is not a 64-bit
// little-endian ELF file.
std::optional<std::string> read_build_record_section(const std::string& path);

// "" when a plugin built with `plugin` can run in this host, else one line naming what differs
// with both values and what to do (the caller adds the file name in front).
std::string build_record_mismatch(const BuildRecord& plugin, const BuildRecord& host);

}  // namespace tessera::core
