// What the fuzz targets share: a scratch folder per process, and the rule that a reader of
// untrusted bytes may refuse them only with tessera::Error (one clear message); any other
// exception escaping, a crash, a leak of memory beyond the limit or a sanitizer report is a
// finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/error.hpp"

namespace tessera::fuzz {

inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("tessera-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::string write_file(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const auto path = scratch() / name;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path.string();
}

// Runs `body`; tessera::Error is the expected way to refuse input, anything else aborts.
template <class Body>
void expect_clean(Body&& body) {
  try {
    body();
  } catch (const tessera::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finding: an exception other than tessera::Error escaped: %s\n", e.what());
    std::abort();
  }
}

}  // namespace tessera::fuzz
