// One source, several test plugins: TESSERA_TEST_MISMATCH (set by tests/CMakeLists.txt) makes
// one value of the build record differ from the host's (torch, compiler or stdlib); without it
// the record matches. Loading the file creates the file named by $TESSERA_TEST_LOAD_MARKER from
// a static initialiser, so a test sees whether any of the plugin's code ran.
#if defined(TESSERA_TEST_MISMATCH_TORCH)
#define TESSERA_BUILD_TORCH_VERSION "1.13.1"
#elif defined(TESSERA_TEST_MISMATCH_COMPILER)
#define TESSERA_BUILD_COMPILER "clang 99.0.0"
#elif defined(TESSERA_TEST_MISMATCH_STDLIB)
#define TESSERA_BUILD_STDLIB "libc++"
#endif
#include <cstdlib>
#include <fstream>

#include "tessera/plugin.hpp"

namespace {

struct MarkWhenLoaded {
  MarkWhenLoaded() {
    if (const char* marker = std::getenv("TESSERA_TEST_LOAD_MARKER")) std::ofstream(marker) << "loaded\n";
  }
} mark_when_loaded;

void register_nothing(tessera::Registrar&) {}

}  // namespace

TESSERA_PLUGIN("build_record", "0.0.1", register_nothing)
