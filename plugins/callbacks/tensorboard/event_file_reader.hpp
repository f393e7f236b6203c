// For the tensorboard callback's tests (header only): an independent reader of its event
// files. It splits TFRecords checking both masked CRC-32Cs of every record, and decodes Event and
// Summary protos from the wire format by hand, without the plugin's generated protobuf code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/formats/crc32c.hpp"

namespace tessera::tensorboard_testing {

namespace fs = std::filesystem;

inline std::uint32_t masked_crc(const char* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

inline std::uint64_t read_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Splits a TFRecord file into its records' data; throws naming the record whose framing or
// checksums are wrong.
inline std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    const std::string where = "record " + std::to_string(records.size());
    if (bytes.size() - at < 12) throw std::runtime_error(where + ": truncated header");
    const char* header = bytes.data() + at;
    if (static_cast<std::uint32_t>(read_le(header + 8, 4)) != masked_crc(header, 8)) {
      throw std::runtime_error(where + ": length CRC mismatch");
    }
    const std::uint64_t length = read_le(header, 8);
    if (bytes.size() - at - 12 < length + 4) throw std::runtime_error(where + ": truncated data");
    const char* data = header + 12;
    if (static_cast<std::uint32_t>(read_le(data + length, 4)) != masked_crc(data, length)) {
      throw std::runtime_error(where + ": data CRC mismatch");
    }
    records.emplace_back(data, length);
    at += 12 + length + 4;
  }
  return records;
}

// What read_records throws for `bytes`, or "" when they read cleanly.
inline std::string framing_error(const std::string& bytes) {
  try {
    read_records(bytes);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// Protobuf wire format: enough to read Event, Summary, Summary.Value and SessionLog.
class WireReader {
 public:
  // Keeps its own copy: nested messages are read from temporaries.
  explicit WireReader(std::string bytes)
      : bytes_(std::move(bytes)), p_(bytes_.data()), end_(p_ + bytes_.size()) {}
  bool done() const { return p_ == end_; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto byte = static_cast<unsigned char>(*p_++);
      v |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    throw std::runtime_error("varint too long");
  }
  std::string bytes(std::size_t n) {
    need(n);
    std::string out(p_, n);
    p_ += n;
    return out;
  }
  std::string length_delimited() { return bytes(varint()); }
  void skip(int wire_type) {
    if (wire_type == 0) varint();
    else if (wire_type == 1) bytes(8);
    else if (wire_type == 2) length_delimited();
    else if (wire_type == 5) bytes(4);
    else throw std::runtime_error("unsupported wire type " + std::to_string(wire_type));
  }

 private:
  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end_ - p_) < n) throw std::runtime_error("truncated message");
  }
  std::string bytes_;
  const char* p_;
  const char* end_;
};

struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::optional<std::string> file_version;
  std::optional<std::vector<std::pair<std::string, float>>> scalars;  // Summary.value
  std::optional<std::int64_t> session_status;                        // SessionLog.status
};

inline std::vector<std::pair<std::string, float>> decode_summary(const std::string& bytes) {
  std::vector<std::pair<std::string, float>> values;
  WireReader summary(bytes);
  while (!summary.done()) {
    const std::uint64_t key = summary.varint();
    if (key != (1 << 3 | 2)) {  // Summary.value
      summary.skip(static_cast<int>(key & 7));
      continue;
    }
    WireReader value(summary.length_delimited());
    std::string tag;
    std::optional<float> simple;
    while (!value.done()) {
      const std::uint64_t k = value.varint();
      if (k == (1 << 3 | 2)) {
        tag = value.length_delimited();
      } else if (k == (2 << 3 | 5)) {
        const std::string raw = value.bytes(4);
        const auto bits = static_cast<std::uint32_t>(read_le(raw.data(), 4));
        float f;
        std::memcpy(&f, &bits, 4);
        simple = f;
      } else {
        value.skip(static_cast<int>(k & 7));
      }
    }
    if (!simple) throw std::runtime_error("summary value " + tag + " has no simple_value");
    values.emplace_back(tag, *simple);
  }
  return values;
}

inline Event decode_event(const std::string& bytes) {
  Event event;
  WireReader in(bytes);
  while (!in.done()) {
    const std::uint64_t key = in.varint();
    const auto field = key >> 3;
    const auto wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 1) {
      const std::string raw = in.bytes(8);
      const std::uint64_t bits = read_le(raw.data(), 8);
      std::memcpy(&event.wall_time, &bits, 8);
    } else if (field == 2 && wire == 0) {
      event.step = static_cast<std::int64_t>(in.varint());
    } else if (field == 3 && wire == 2) {
      event.file_version = in.length_delimited();
    } else if (field == 5 && wire == 2) {
      event.scalars = decode_summary(in.length_delimited());
    } else if (field == 7 && wire == 2) {  // session_log (6 is the old log_message)
      WireReader log(in.length_delimited());
      event.session_status = 0;
      while (!log.done()) {
        const std::uint64_t k = log.varint();
        if (k == (1 << 3 | 0)) event.session_status = static_cast<std::int64_t>(log.varint());
        else log.skip(static_cast<int>(k & 7));
      }
    } else {
      in.skip(wire);
    }
  }
  return event;
}

inline std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

inline std::vector<Event> read_events(const fs::path& file) {
  std::vector<Event> events;
  for (const std::string& record : read_records(read_file(file))) events.push_back(decode_event(record));
  return events;
}

}  // namespace tessera::tensorboard_testing
