#include "tessera/core/plugins/plugin_build_record.hpp"

#include <elf.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "tessera/build_record.hpp"
#include "tessera/error.hpp"

namespace tessera::core {
namespace {

// "gcc 12.2.0" -> "gcc 12": minor releases of one compiler keep its C++ ABI.
std::string family_and_major(const std::string& compiler) {
  const auto space = compiler.find(' ');
  const auto dot = compiler.find('.', space == std::string::npos ? 0 : space);
  return compiler.substr(0, dot);
}

template <class T>
bool read_at(std::istream& in, std::uint64_t offset, T& out) {
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(&out), sizeof out);
  return static_cast<bool>(in);
}

}  // namespace

const BuildRecord& host_build_record() {
  static const BuildRecord record = parse_build_record(TESSERA_BUILD_RECORD);
  return record;
}

BuildRecord parse_build_record(const std::string& text) {
  BuildRecord record;
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);
  record.format = line;
  while (std::getline(lines, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "sdk_abi") record.sdk_abi = value;
    if (key == "torch") record.torch = value;
    if (key == "compiler") record.compiler = value;
    if (key == "stdlib") record.stdlib = value;
  }
  return record;
}

// Section headers, then the section-name string table, then the named section: read with
// bounds checks only, since a plugin file may be anything (Boost.DLL's library_info lists
// section names but does not return their contents).
std::optional<std::string> read_build_record_section(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error("cannot read " + path);
  const std::streamoff end = in.tellg();
  if (end < 0) throw Error("cannot read " + path);
  const auto file_size = static_cast<std::uint64_t>(end);
  Elf64_Ehdr header{};
  if (!read_at(in, 0, header) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
    throw Error("not an ELF shared library");
  }
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB) {
    throw Error("not a 64-bit little-endian ELF file");
  }
  if (header.e_shoff == 0) return std::nullopt;  // no section headers at all
  if (header.e_shentsize != sizeof(Elf64_Shdr) || header.e_shoff > file_size) {
    throw Error("its ELF section headers are malformed");
  }
  auto section = [&](std::uint64_t index) {
    Elf64_Shdr s{};
    if (!read_at(in, header.e_shoff + index * sizeof(Elf64_Shdr), s)) throw Error("its ELF section headers are unreadable");
    return s;
  };
  // With many sections the counts live in section 0 (SHN_XINDEX / e_shnum 0).
  std::uint64_t count = header.e_shnum, names_index = header.e_shstrndx;
  if (count == 0 || names_index == SHN_XINDEX) {
    const Elf64_Shdr first = section(0);
    if (count == 0) count = first.sh_size;
    if (names_index == SHN_XINDEX) names_index = first.sh_link;
  }
  if (count > (file_size - header.e_shoff) / sizeof(Elf64_Shdr) || names_index >= count) {
    throw Error("its ELF section headers are malformed");
  }
  auto contents = [&](const Elf64_Shdr& s) {
    if (s.sh_type == SHT_NOBITS || s.sh_offset > file_size || s.sh_size > file_size - s.sh_offset) {
      throw Error("an ELF section lies outside the file");
    }
    std::string bytes(static_cast<std::size_t>(s.sh_size), '\0');
    in.seekg(static_cast<std::streamoff>(s.sh_offset));
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!in) throw Error("an ELF section is unreadable");
    return bytes;
  };
  const std::string names = contents(section(names_index));
  for (std::uint64_t i = 0; i < count; ++i) {
    const Elf64_Shdr s = section(i);
    if (s.sh_name >= names.size()) continue;
    if (std::strcmp(names.c_str() + s.sh_name, kBuildRecordSection) != 0) continue;
    std::string text = contents(s);
    text.resize(std::strlen(text.c_str()));  // the record is one NUL-terminated string
    return text;
  }
  return std::nullopt;
}

std::string build_record_mismatch(const BuildRecord& plugin, const BuildRecord& host) {
  if (plugin.format != host.format) {
    return "has a build record of another format (\"" + plugin.format + "\", this host reads \"" + host.format +
           "\"); rebuild the plugin against this SDK";
  }
  if (plugin.sdk_abi != host.sdk_abi) {
    return "was built against Tessera SDK ABI version " + plugin.sdk_abi + ", but this host has ABI version " +
           host.sdk_abi + "; rebuild the plugin against this SDK";
  }
  if (plugin.torch != host.torch) {
    return "was built against LibTorch " + plugin.torch + ", but this host runs LibTorch " + host.torch +
           "; rebuild the plugin against the host's LibTorch (find_package(Tessera) points at it)";
  }
  if (family_and_major(plugin.compiler) != family_and_major(host.compiler)) {
    return "was built with " + plugin.compiler + ", but this host with " + host.compiler +
           "; rebuild the plugin with the host's compiler";
  }
  if (plugin.stdlib != host.stdlib) {
    return "was built against the C++ library " + plugin.stdlib + ", but this host uses " + host.stdlib +
           "; rebuild the plugin with the host's standard library and _GLIBCXX_USE_CXX11_ABI";
  }
  return {};
}

}  // namespace tessera::core
