#include "tessera/formats/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tessera/formats/crc32c.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace {

std::string errno_text() { return std::strerror(errno); }

// Injected I/O errors, for the tests that prove a failed save never costs the previous
// checkpoint: TESSERA_IO_FAULT=OP[@N][:ERRNO] makes the N-th (default: first) call of OP in this
// process fail as if the kernel had returned ERRNO (ENOSPC, the default, or EIO). OP is create,
// write, fsync, rename or fsync_dir. TESSERA_IO_FAULT_PATH=SUFFIX counts only calls on paths
// ending in SUFFIX (a rename's target); TESSERA_IO_FAULT_RANK=R arms only the process whose RANK
// is R. Unset, it costs one comparison per call.
struct IoFault {
  std::string op, suffix;
  long nth = 1;
  int error = ENOSPC;
};

const IoFault* armed_fault() {
  static const IoFault* fault = []() -> const IoFault* {
    const char* spec = std::getenv("TESSERA_IO_FAULT");
    if (!spec || !*spec) return nullptr;
    if (const char* only = std::getenv("TESSERA_IO_FAULT_RANK"); only && *only) {
      const char* rank = std::getenv("RANK");
      if (std::string(rank ? rank : "0") != only) return nullptr;
    }
    auto* f = new IoFault;
    f->op = spec;
    bool valid = true;
    if (const auto colon = f->op.find(':'); colon != std::string::npos) {
      const std::string name = f->op.substr(colon + 1);
      valid = name == "EIO" || name == "ENOSPC";
      f->error = name == "EIO" ? EIO : ENOSPC;
      f->op.resize(colon);
    }
    if (const auto at = f->op.find('@'); at != std::string::npos) {
      char* end = nullptr;
      f->nth = std::strtol(f->op.c_str() + at + 1, &end, 10);
      valid = valid && *end == '\0' && f->nth >= 1;
      f->op.resize(at);
    }
    valid = valid && (f->op == "create" || f->op == "write" || f->op == "fsync" || f->op == "rename" ||
                      f->op == "fsync_dir");
    if (!valid) {
      // A test whose fault never fires would pass for the wrong reason: refuse the spec outright.
      std::fprintf(stderr, "TESSERA_IO_FAULT=%s: expected OP[@N][:ENOSPC|EIO] with OP create, write, fsync, "
                           "rename or fsync_dir and N >= 1\n", spec);
      std::_Exit(2);
    }
    if (const char* suffix = std::getenv("TESSERA_IO_FAULT_PATH")) f->suffix = suffix;
    return f;
  }();
  return fault;
}

// True (with errno set) when this call is the one to fail.
bool injected_failure(const char* op, const std::string& path) {
  const IoFault* f = armed_fault();
  if (!f || f->op != op) return false;
  if (!f->suffix.empty() &&
      (path.size() < f->suffix.size() || path.compare(path.size() - f->suffix.size(), f->suffix.size(), f->suffix) != 0)) {
    return false;
  }
  static std::atomic<long> calls{0};
  if (++calls != f->nth) return false;
  errno = f->error;
  return true;
}

}  // namespace

DurableFile::DurableFile(std::string path) : path_(std::move(path)) {
  fd_ = injected_failure("create", path_) ? -1 : ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
    const ssize_t n = injected_failure("write", path_) ? -1 : ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + path_ + ": " + errno_text());
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void DurableFile::commit() {
  if (injected_failure("fsync", path_) || ::fsync(fd_) != 0) throw Error("cannot fsync " + path_ + ": " + errno_text());
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
  const int rc = injected_failure("fsync_dir", path) ? -1 : ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  errno = saved_errno;
  if (rc != 0) throw Error("cannot fsync directory " + path + ": " + errno_text());
}

void rename_durably(const std::string& from, const std::string& to) {
  if (injected_failure("rename", to) || std::rename(from.c_str(), to.c_str()) != 0) {
    throw Error("cannot rename " + from + " to " + to + ": " + errno_text());
  }
  const auto parent = std::filesystem::path(to).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace tessera
