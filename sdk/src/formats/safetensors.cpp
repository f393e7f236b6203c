#include "tessera/formats/safetensors.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string_view>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/formats/durable_file.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace {

// Headers larger than this are refused (the reference implementation's limit is 100 MB).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

const std::vector<std::pair<const char*, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<const char*, at::ScalarType>> d = {
      {"F64", at::kDouble}, {"F32", at::kFloat},  {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return d;
}

const char* dtype_name(at::ScalarType t, const std::string& key) {
  for (const auto& [name, type] : dtypes()) {
    if (type == t) return name;
  }
  throw Error("safetensors: tensor " + key + " has dtype " + std::string(c10::toString(t)) +
              ", which the format cannot hold");
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

WrittenFile write_safetensors(const std::string& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> host;
  std::uint64_t offset = 0;
  for (const auto& [key, tensor] : tensors) {
    if (key == "__metadata__") throw Error("safetensors: __metadata__ is not a tensor name");
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const std::uint64_t bytes = t.nbytes();
    header[key] = {{"dtype", dtype_name(t.scalar_type(), key)},
                   {"shape", t.sizes().vec()},
                   {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    host.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string prefix;
  put_u64(prefix, text.size());
  DurableFile file(path);
  file.append(prefix.data(), prefix.size());
  file.append(text.data(), text.size());
  for (const auto& t : host) file.append(t.const_data_ptr(), t.nbytes());
  file.commit();
  return {file.bytes(), file.crc()};
}

namespace {

// A read-only file mapped into memory, unmapped when the last tensor viewing it goes. Private
// (copy-on-write): a tensor written in place never changes the file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error("cannot read " + path + ": " + std::strerror(errno));
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd);
      throw Error("cannot read " + path + ": not a regular file");
    }
    size_ = static_cast<std::size_t>(info.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        throw Error("cannot map " + path + ": " + std::strerror(err));
      }
      data_ = static_cast<char*>(p);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  std::size_t size_ = 0;
};

// Parses the bytes [data, data + size). With `mapping`, tensors whose bytes are aligned for
// their dtype view the mapping (which they keep alive) instead of being copied.
SafetensorsFile parse(const char* data, std::size_t size, const std::string& name,
                      const std::shared_ptr<MappedFile>& mapping) {
  const std::string_view bytes(data, size);
  auto fail = [&](const std::string& why) { return Error(name + ": not a valid safetensors file: " + why); };
  if (bytes.size() < 8) throw fail("shorter than its 8-byte header length");
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (header_size > kMaxHeaderBytes || header_size > bytes.size() - 8) {
    throw fail("header length " + std::to_string(header_size) + " exceeds the file (" + std::to_string(bytes.size()) +
               " bytes)");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  const std::uint64_t data_start = 8 + header_size;
  const std::uint64_t data_size = bytes.size() - data_start;

  SafetensorsFile out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw fail("__metadata__." + k + " is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      throw fail("entry " + key + " lacks dtype, shape or data_offsets");
    }
    const auto& dtype = entry["dtype"];
    const auto& shape = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!dtype.is_string() || !shape.is_array() || !offsets.is_array() || offsets.size() != 2 ||
        !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      throw fail("entry " + key + " has a malformed dtype, shape or data_offsets");
    }
    const auto type = std::find_if(dtypes().begin(), dtypes().end(),
                                   [&](const auto& d) { return dtype.get<std::string>() == d.first; });
    if (type == dtypes().end()) throw fail("entry " + key + " has unsupported dtype " + dtype.get<std::string>());
    std::vector<std::int64_t> sizes;
    std::uint64_t numel = 1;
    for (const auto& dim : shape) {
      if (!dim.is_number_unsigned()) throw fail("entry " + key + " has a negative or non-integer dimension");
      const std::uint64_t d = dim.get<std::uint64_t>();
      if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / d)) {
        throw fail("entry " + key + " has an impossible shape");
      }
      numel *= d;
      sizes.push_back(static_cast<std::int64_t>(d));
    }
    const std::uint64_t begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    const std::uint64_t element = c10::elementSize(type->second);
    if (begin > end || end > data_size) throw fail("entry " + key + " lies outside the data");
    if (numel > (end - begin) / element || numel * element != end - begin) {
      throw fail("entry " + key + " has " + std::to_string(end - begin) + " bytes for " + std::to_string(numel) +
                 " elements of " + dtype.get<std::string>());
    }
    at::Tensor t;
    const char* source = bytes.data() + data_start + begin;
    try {
      if (mapping && end > begin && reinterpret_cast<std::uintptr_t>(source) % element == 0) {
        t = at::from_blob(const_cast<char*>(source), sizes, [mapping](void*) {},
                          at::TensorOptions().dtype(type->second));
      } else {
        t = at::empty(sizes, at::TensorOptions().dtype(type->second));
        if (end > begin) std::memcpy(t.mutable_data_ptr(), source, end - begin);
      }
    } catch (const c10::Error& e) {
      throw fail("entry " + key + " has a shape LibTorch cannot hold: " + e.what_without_backtrace());
    }
    out.tensors[key] = std::move(t);
    ranges.emplace_back(begin, end);
  }
  // The byte buffer is covered exactly: no overlaps, no holes (the format's rule).
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t expected = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != expected) throw fail("tensor data overlaps or leaves a hole at byte " + std::to_string(expected));
    expected = end;
  }
  if (expected != data_size) throw fail(std::to_string(data_size - expected) + " bytes after the last tensor");
  return out;
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& name) {
  return parse(bytes.data(), bytes.size(), name, nullptr);
}

SafetensorsFile read_safetensors(const std::string& path) {
  // Memory-mapped: a multi-gigabyte checkpoint is paged in as its tensors are used, and never
  // held twice (a buffer of the file plus the tensors copied out of it).
  auto mapping = std::make_shared<MappedFile>(path);
  return parse(mapping->data(), mapping->size(), path, mapping);
}

}  // namespace tessera
