// Calls a function no library defines: loading it must fail with the loader's own message (its
// build record matches, so the host gets as far as loading it).
#include "tessera/plugin.hpp"

TESSERA_PLUGIN_BUILD_RECORD()

extern "C" int tessera_test_symbol_that_does_not_exist();
extern "C" __attribute__((visibility("default"))) int uses_missing_symbol() {
  return tessera_test_symbol_that_does_not_exist();
}
