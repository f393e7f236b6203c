// `tessera new-plugin KIND NAME [--dir D]`.
#include <boost/program_options.hpp>

#include <filesystem>
#include <iostream>
#include <set>
#include <string>

#include "commands.hpp"
#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/tooling/plugin_scaffold.hpp"
#include "tessera/core/config/suggest.hpp"

namespace po = boost::program_options;

namespace tessera::cli {

int new_plugin_command(const Args& args) {
  std::string kind, name, dir = ".";
  po::options_description visible(
      "usage: tessera new-plugin KIND NAME [--dir D]\n"
      "Writes D/NAME/ (source, CMakeLists.txt, README.md, a test run spec) for a plugin of KIND\n"
      "(" + core::join(tooling::scaffold_kinds()) + ") that builds with find_package(Tessera).\n\noptions");
  visible.add_options()("dir", po::value<std::string>(&dir), "parent folder (default: .)")("help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("kind", po::value<std::string>(&kind))("name", po::value<std::string>(&name));
  po::positional_options_description positional;
  positional.add("kind", 1).add("name", 1);
  if (!parse_command_line(args, visible, hidden, positional)) return 0;
  if (kind.empty() || name.empty()) throw UsageError("expected KIND and NAME");
  // A name the loaded plugins already register would be refused as a duplicate at load time.
  core::PluginHost host;
  host.load_directories(core::plugin_search_path({}, {}));
  if (host.registry().find(kind, name)) {
    throw UsageError(kind + "/" + name + " is already registered by " + host.registry().find(kind, name)->origin);
  }
  const std::string folder = tooling::scaffold_plugin(kind, name, dir);
  std::set<std::string> written;  // in name order
  for (const auto& entry : std::filesystem::directory_iterator(folder)) written.insert(entry.path().filename().string());
  std::string files;
  for (const std::string& file : written) files += (files.empty() ? "" : ", ") + file;
  std::cout << "wrote " << folder << "/{" << files << "}\n"
            << "build and test it against an installed Tessera:\n"
            << "  cmake -S " << folder << " -B " << folder << "/build -DCMAKE_PREFIX_PATH=<tessera prefix>\n"
            << "  cmake --build " << folder << "/build && ctest --test-dir " << folder << "/build\n";
  return 0;
}

}  // namespace tessera::cli
