// Writing files so that a crash (SIGKILL, power loss) leaves either the old state or the new one:
// data written and fsynced before a rename makes it visible, directories fsynced after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/export.hpp"

namespace tessera {

// A file being written: every append goes to the kernel; commit() fsyncs and closes. Destroyed
// uncommitted, it is closed and removed (a half-written file never stays behind under its name).
class TESSERA_API DurableFile {
 public:
  explicit DurableFile(std::string path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void append(const void* data, std::size_t size);
  void commit();
  const std::string& path() const { return path_; }
  // What has been appended so far: its length and CRC-32C.
  std::uint64_t bytes() const { return bytes_; }
  std::uint32_t crc() const { return crc_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t bytes_ = 0;
  std::uint32_t crc_ = 0;
};

// A file as written: its size and CRC-32C, recorded in checkpoint manifests.
struct WrittenFile {
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0;
};

// Writes `text` to `path` (fsynced).
TESSERA_API WrittenFile write_file_durably(const std::string& path, const std::string& text);
// fsync on a directory, so renames and new entries in it survive a crash.
TESSERA_API void fsync_directory(const std::string& path);
// rename(2) + fsync of the target's directory: `to` is atomically replaced.
TESSERA_API void rename_durably(const std::string& from, const std::string& to);

}  // namespace tessera
