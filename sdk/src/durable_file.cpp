#include "tessera/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tessera/crc32c.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

DurableFile::DurableFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot create " + path_ + ": " + errno_text());
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void DurableFile::append(const void* data, std::size_t size) {
  crc_ = crc32c(data, size, crc_);
  bytes_ += size;
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + path_ + ": " + errno_text());
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) throw Error("cannot fsync " + path_ + ": " + errno_text());
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw Error("cannot close " + path_ + ": " + errno_text());
  }
  fd_ = -1;
}

WrittenFile write_file_durably(const std::string& path, const std::string& text) {
  DurableFile file(path);
  file.append(text.data(), text.size());
  file.commit();
  return {file.bytes(), file.crc()};
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open directory " + path + ": " + errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("cannot fsync directory " + path + ": " + errno_text());
}

void rename_durably(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw Error("cannot rename " + from + " to " + to + ": " + errno_text());
  }
  const auto parent = std::filesystem::path(to).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace tessera
