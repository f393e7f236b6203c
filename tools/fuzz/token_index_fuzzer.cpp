// A token file's index (FILE.json from tessera prepare-data) as dataset/tokens and
// dataset/mixture read it at validation, and the file-size checks beside it.
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "token_file_checks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  static const std::string tokens = [] {
    const std::string bytes(4096, '\x01');
    return fuzz::write_file("tokens.bin", reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }();
  fuzz::write_file("tokens.bin.json", data, size);
  fuzz::expect_clean([&] {
    const auto index = token_data::read_index(tokens);
    (void)index;
    token_data::check_token_file_size(tokens, "uint16", 64, "path");
    token_data::check_index(tokens, "uint16", 50257);
  });
  return 0;
}
