// A checkpoint's metadata.json as --resume and `tessera eval --resume` read it: a folder whose
// metadata is the input, beside a real, small model file, verified and then read for rank 0;
// and the same bytes as a rank's manifest.json, as rank 0 reads the others' while it saves.
#include <cstdint>
#include <string>

#include <ATen/ops/ones.h>

#include "fuzz_support.hpp"
#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/formats/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  static const std::string folder = [] {
    const auto dir = fuzz::scratch() / "step_00000006";
    std::filesystem::create_directories(dir / "rank_00000");
    write_safetensors((dir / "model.safetensors").string(), {{"w", at::ones({4, 4})}});
    return dir.string();
  }();
  fuzz::write_file("step_00000006/metadata.json", data, size);
  fuzz::expect_clean([&] {
    core::verify_checkpoint(folder);
    (void)core::read_checkpoint(folder, 0);
  });
  const std::string manifest = fuzz::write_file("manifest.json", data, size);
  fuzz::expect_clean([&] { (void)core::read_rank_manifest(manifest); });
  return 0;
}
