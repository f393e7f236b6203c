// The run-spec reader as every command uses it: the YAML text (with anchors, aliases, merge
// keys and includes of a fixed file base.yaml), a --set override taken from a first line
// "#set KEY=VALUE" (a comment to YAML), and ${...} interpolation, all under config_limits.
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "tessera/core/config/config_file.hpp"
#include "tessera/core/config/config_interpolation.hpp"
#include "tessera/core/config/config_override.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  static const std::string included = [] {
    const std::string text = "base: {lr: 1.0e-3, steps: 10, name: base}\nlist: [1, 2, 3]\n";
    return fuzz::write_file("base.yaml", reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  }();
  (void)included;
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string assignment;
  if (input.rfind("#set ", 0) == 0) {
    const auto newline = input.find('\n');
    assignment = input.substr(5, newline == std::string::npos ? std::string::npos : newline - 5);
  }
  const std::string path = fuzz::write_file("spec.yaml", data, size);
  fuzz::expect_clean([&] {
    core::ConfigNode root = core::load_config_file(path);
    if (!assignment.empty()) core::apply_override(root, assignment);
    core::resolve_interpolations(root);
    (void)root.to_yaml();
  });
  return 0;
}
