// `tessera components` and `tessera describe`: what the loaded plugins offer.
#include <boost/program_options.hpp>

#include <iomanip>
#include <iostream>
#include <map>

#include "commands.hpp"
#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/tooling/registry_export.hpp"
#include "tessera/core/run/spec_sections.hpp"
#include "tessera/core/config/suggest.hpp"

namespace po = boost::program_options;

namespace tessera::cli {
namespace {

struct RegistryArgs {
  std::vector<std::string> plugin_paths;
  std::string positional;
  std::string kind;
  bool help = false;
  bool json = false;
  bool markdown = false;
};

RegistryArgs parse(const Args& args, const std::string& usage, bool with_kind, const char* positional_name) {
  RegistryArgs parsed;
  po::options_description visible(usage + "\n\noptions");
  visible.add_options()
      ("plugin-path", po::value<std::vector<std::string>>(&parsed.plugin_paths)->composing(),
       "also search DIR for plugins")
      ("help,h", "show this help");
  if (with_kind) {
    visible.add_options()
        ("kind", po::value<std::string>(&parsed.kind), "only this kind")
        ("json", po::bool_switch(&parsed.json), "print JSON: every component with its schema")
        ("markdown", po::bool_switch(&parsed.markdown), "print the Markdown of docs/components.md");
  }
  po::options_description hidden;
  po::positional_options_description positional;
  if (positional_name) {
    hidden.add_options()(positional_name, po::value<std::string>(&parsed.positional));
    positional.add(positional_name, 1);
  }
  parsed.help = !parse_command_line(args, visible, hidden, positional);
  return parsed;
}

void print_schema(const Schema& schema) {
  if (schema.fields().empty()) {
    std::cout << "  (no config fields)\n";
    return;
  }
  for (const auto& f : schema.fields()) {
    std::cout << "  " << f.name << " (" << to_string(f.type) << ")";
    if (f.has_default()) {
      std::cout << " = " << to_display_string(f.default_value);
    } else if (f.is_required) {
      std::cout << " required";
    } else {
      std::cout << " optional";
    }
    if (std::string c = f.constraints_text(); !c.empty()) std::cout << " [" << c << "]";
    std::cout << "\n      " << f.doc << "\n";
  }
  if (!schema.mesh_axes().empty()) {
    std::string axes;
    for (const auto& a : schema.mesh_axes()) axes += (axes.empty() ? "" : ", ") + a;
    std::cout << "\nsplits over the device mesh's axes: " << axes << " (parallelism:)\n";
  }
}

}  // namespace

int components_command(const Args& args) {
  RegistryArgs parsed = parse(args, "usage: tessera components [--kind KIND]", true, nullptr);
  if (parsed.help) return 0;
  core::PluginHost host;
  host.load_directories(core::plugin_search_path({}, parsed.plugin_paths));
  if (parsed.markdown) {
    std::cout << tooling::components_markdown(host.registry());
    return 0;
  }
  const auto list = host.registry().list(parsed.kind);
  if (list.empty() && !parsed.kind.empty()) {
    throw UsageError("no components of kind '" + parsed.kind + "'" +
                     core::did_you_mean(parsed.kind, host.registry().kinds()) +
                     "; loaded kinds: " + core::join(host.registry().kinds()));
  }
  if (parsed.json) {
    std::cout << tooling::components_json(host.registry(), parsed.kind).dump(2) << "\n";
    return 0;
  }
  for (const auto* info : list) {
    std::cout << std::left << std::setw(28) << (info->kind + "/" + info->variant) << " "
              << info->origin << "\n    " << info->doc << "\n";
  }
  return 0;
}

int describe_command(const Args& args) {
  RegistryArgs parsed =
      parse(args, "usage: tessera describe KIND/VARIANT | trainer | settings | checkpoint | parallelism", false,
            "component");
  if (parsed.help) return 0;
  const std::map<std::string, Schema> sections = {{"trainer", core::trainer_schema()},
                                                  {"settings", core::settings_schema()},
                                                  {"checkpoint", core::checkpoint_schema()},
                                                  {"parallelism", core::parallelism_schema()}};
  if (const auto section = sections.find(parsed.positional); section != sections.end()) {
    std::cout << parsed.positional << " (section of the run spec)\n";
    print_schema(section->second);
    return 0;
  }
  auto slash = parsed.positional.find('/');
  if (slash == std::string::npos) throw UsageError("expected KIND/VARIANT, e.g. optimizer/adamw");
  const std::string kind = parsed.positional.substr(0, slash);
  const std::string variant = parsed.positional.substr(slash + 1);
  core::PluginHost host;
  host.load_directories(core::plugin_search_path({}, parsed.plugin_paths));
  const ComponentInfo* info = host.registry().find(kind, variant);
  if (!info) {
    std::vector<std::string> names;
    for (const auto* i : host.registry().list()) names.push_back(i->kind + "/" + i->variant);
    throw UsageError("no component " + parsed.positional + core::did_you_mean(parsed.positional, names) +
                     "; see tessera components");
  }
  std::cout << info->kind << "/" << info->variant << ": " << info->doc << "\n"
            << "  from " << info->origin << "\n\nconfig:\n";
  print_schema(info->schema);
  return 0;
}

int schema_command(const Args& args) {
  RegistryArgs parsed = parse(args, "usage: tessera schema [--plugin-path DIR]...\n"
                                    "Prints a JSON Schema of the run spec with every loaded component's config.",
                              false, nullptr);
  if (parsed.help) return 0;
  core::PluginHost host;
  host.load_directories(core::plugin_search_path({}, parsed.plugin_paths));
  std::cout << tooling::run_spec_json_schema(host.registry()).dump(2) << "\n";
  return 0;
}

}  // namespace tessera::cli
