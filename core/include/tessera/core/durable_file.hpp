// Writing files so that a crash (SIGKILL, power loss) leaves either the old state or the new one:
// data written and fsynced before a rename makes it visible, directories fsynced after.
#pragma once

#include <cstddef>
#include <string>

namespace tessera::core {

// A file being written: every append goes to the kernel; commit() fsyncs and closes. Destroyed
// uncommitted, it is closed and removed (a half-written file never stays behind under its name).
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void append(const void* data, std::size_t size);
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Writes `text` to `path` (fsynced).
void write_file_durably(const std::string& path, const std::string& text);
// fsync on a directory, so renames and new entries in it survive a crash.
void fsync_directory(const std::string& path);
// rename(2) + fsync of the target's directory: `to` is atomically replaced.
void rename_durably(const std::string& from, const std::string& to);

}  // namespace tessera::core
