// The safetensors reader (checkpoints, exports, Hugging Face imports): the header's JSON, dtypes,
// shapes and offsets against the file's length, through the memory-mapped path the runs use.
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "tessera/formats/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string path = fuzz::write_file("model.safetensors", data, size);
  fuzz::expect_clean([&] {
    const SafetensorsFile file = read_safetensors(path);
    for (const auto& [name, tensor] : file.tensors) (void)tensor.sum();  // every byte it claims is readable
  });
  fuzz::expect_clean([&] { (void)parse_safetensors(std::string(reinterpret_cast<const char*>(data), size), "input"); });
  return 0;
}
