// safetensors files and CRC-32C: round trips of every dtype, the format's byte layout, and a
// fuzzed reader that turns every malformed file into one tessera::Error (never a crash).
#include "tessera/formats/safetensors.hpp"

#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <fstream>
#include <random>
#include <sstream>

#include "tessera/formats/crc32c.hpp"
#include "tessera/error.hpp"
#include "test_support.hpp"

namespace tessera {
namespace safetensors_test {

using testing::TempDir;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  // The check value of CRC-32C (RFC 3720, iSCSI) over "123456789".
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // Incremental equals one pass.
  const std::string text = "The quick brown fox jumps over the lazy dog, twice over the dog.";
  EXPECT_EQ(crc32c(text.data() + 10, text.size() - 10, crc32c(text.data(), 10)), crc32c(text.data(), text.size()));
}

TEST(Safetensors, RoundTripsEveryDtypeWithMetadata) {
  TempDir dir;
  StateDict tensors = {
      {"f32", at::randn({3, 4})},
      {"f64", at::randn({2}, at::kDouble)},
      {"f16", at::randn({5}).to(at::kHalf)},
      {"bf16", at::randn({2, 2}).to(at::kBFloat16)},
      {"i64", at::arange(7)},
      {"i32", at::arange(3).to(at::kInt)},
      {"u8", at::arange(9).to(at::kByte)},
      {"bool", at::arange(4).remainder(2).to(at::kBool)},
      {"scalar", at::scalar_tensor(42, at::kLong)},
      {"empty", at::randn({0, 3})},
      {"strided", at::randn({4, 6}).t()},  // written contiguous
  };
  const std::string path = dir.file("t.safetensors");
  write_safetensors(path, tensors, {{"format", "tessera"}, {"step", "12"}});
  const SafetensorsFile back = read_safetensors(path);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [key, t] : tensors) {
    ASSERT_TRUE(back.tensors.count(key)) << key;
    EXPECT_EQ(back.tensors.at(key).scalar_type(), t.scalar_type()) << key;
    EXPECT_TRUE(back.tensors.at(key).equal(t)) << key;
  }
  EXPECT_EQ(back.metadata.at("format"), "tessera");
  EXPECT_EQ(back.metadata.at("step"), "12");
}

TEST(Safetensors, LayoutIsTheFormatsLittleEndianLengthJsonAndAlignedData) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_safetensors(path, {{"w", at::arange(4).to(at::kFloat)}});
  const std::string bytes = file_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "data starts 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + n + 16);
  EXPECT_NE(bytes.substr(8, n).find(R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), std::string::npos)
      << bytes.substr(8, n);
  float third = 0;
  std::memcpy(&third, bytes.data() + 8 + n + 8, 4);
  EXPECT_EQ(third, 2.0f);
}

TEST(Safetensors, RefusesBadFilesWithTheirName) {
  auto error_of = [](const std::string& bytes) {
    try {
      parse_safetensors(bytes, "x.safetensors");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto with_header = [](const std::string& json, const std::string& data) {
    std::string out;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((json.size() >> (8 * i)) & 0xFF));
    return out + json + data;
  };
  EXPECT_NE(error_of("abc").find("x.safetensors: not a valid safetensors file: shorter"), std::string::npos);
  EXPECT_NE(error_of(with_header("{", "")).find("header is not JSON"), std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"))
                .find("outside the data"), std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678"))
                .find("8 bytes for 3 elements"), std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "1"))
                .find("unsupported dtype Q7"), std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                 R"("b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "12"))
                .find("overlaps or leaves a hole"), std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "1"))
                .find("negative"), std::string::npos);
}

TEST(Safetensors, FuzzedFilesNeverCrashTheReader) {
  TempDir dir;
  const std::string path = dir.file("seed.safetensors");
  write_safetensors(path, {{"a", at::randn({3, 5})}, {"b", at::arange(11)}, {"c", at::scalar_tensor(1.5)}},
                    {{"k", "v"}});
  const std::string seed = file_bytes(path);
  std::mt19937 rng(1234);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string bytes = seed;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 5) {
        case 0: bytes[rng() % bytes.size()] = static_cast<char>(rng()); break;       // any byte
        case 1: bytes[rng() % 8] = static_cast<char>(rng()); break;                  // the length
        case 2: bytes.resize(rng() % (bytes.size() + 1)); break;                     // truncation
        case 3: bytes.insert(rng() % (bytes.size() + 1), 1, static_cast<char>(rng())); break;
        case 4: {  // a digit in the JSON header becomes another digit
          const auto pos = bytes.find_first_of("0123456789", 8 + rng() % 64);
          if (pos != std::string::npos) bytes[pos] = static_cast<char>('0' + rng() % 10);
          break;
        }
      }
      if (bytes.empty()) break;
    }
    try {
      parse_safetensors(bytes, "fuzz");
      ++accepted;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_EQ(accepted + refused, 4000);
}

}  // namespace safetensors_test
}  // namespace tessera
