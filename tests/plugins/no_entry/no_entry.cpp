// A shared library with a valid build record that forgot the entry point (TESSERA_PLUGIN(...)).
#include "tessera/plugin.hpp"

TESSERA_PLUGIN_BUILD_RECORD()

extern "C" __attribute__((visibility("default"))) int not_the_entry() { return 1; }
