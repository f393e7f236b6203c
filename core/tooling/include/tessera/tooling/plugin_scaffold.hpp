// `tessera new-plugin KIND NAME`: writes a plugin folder (source, CMakeLists, README and a test
// run spec) that builds against the installed SDK with find_package(Tessera) and whose ctest
// loads it into the installed host and trains two steps with it.
#pragma once

#include <string>
#include <vector>

namespace tessera::tooling {

// The kinds a scaffold exists for.
std::vector<std::string> scaffold_kinds();

// Writes DIR/NAME/... and returns the folder. Throws tessera::ConfigError for an unknown kind,
// a name that is not a C identifier, or a folder that already exists.
std::string scaffold_plugin(const std::string& kind, const std::string& name, const std::string& dir);

}  // namespace tessera::tooling
