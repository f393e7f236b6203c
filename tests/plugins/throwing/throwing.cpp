// A plugin whose register function throws.
#include <stdexcept>

#include "tessera/plugin.hpp"

namespace {
void register_components(tessera::Registrar&) { throw std::runtime_error("cannot find my data"); }
}  // namespace

TESSERA_PLUGIN("throwing", "0.0.1", register_components)
