// `tessera`: the host binary. Dispatches to a subcommand and turns errors into one line on
// stderr and an exit code (0 ok, 2 bad config or usage, 1 failure at run time).
#include <c10/util/Exception.h>

#include <cstring>
#include <iostream>
#include <map>

#include "commands.hpp"
#include "tessera/core/plugins/plugin_build_record.hpp"
#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/version.hpp"

namespace {

const char* kUsage =
    "usage: tessera <command> [options]\n"
    "\n"
    "commands:\n"
    "  train CONFIG       train from a run spec\n"
    "  validate CONFIG    check a run spec and every component in it, building nothing\n"
    "  eval CONFIG        the model's loss on the spec's evaluation data, one JSON line on stdout\n"
    "  generate CONFIG (--prompt TEXT | --prompts FILE)\n"
    "                     completions of the spec's model, one JSON line per prompt\n"
    "  chat CONFIG        talk with the spec's model in the terminal (its chat template)\n"
    "  plan CONFIG --ranks N [--device-memory GiB]\n"
    "                     the meshes for N ranks: memory and bytes moved per rank, bubble, ranked\n"
    "  prepare-data INPUT... --tokenizer SPEC --out FILE\n"
    "                     tokenise text or JSON lines into a token file for dataset/tokens\n"
    "  components         list the registered components and the plugin files they come from\n"
    "  describe KIND/VARIANT\n"
    "                     show a component's config schema (also: describe trainer|settings|checkpoint|parallelism)\n"
    "  schema             print a JSON Schema of the run spec (for editors)\n"
    "  launch --nproc-per-node N -- COMMAND ...\n"
    "                     start N ranks of COMMAND (e.g. train CONFIG) with torchrun's variables\n"
    "  new-plugin KIND NAME [--dir D]\n"
    "                     scaffold a plugin that builds against the installed SDK\n"
    "\n"
    "options:\n"
    "  --version          print the version\n"
    "  --help             this text; `tessera <command> --help` for a command's options\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    (argc < 2 ? std::cerr : std::cout) << kUsage;
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    // What a plugin's build record must match (docs/writing-a-plugin.md).
    const core::BuildRecord& built = core::host_build_record();
    std::cout << "tessera " << TESSERA_VERSION_STRING << " (SDK ABI " << kSdkAbiVersion << "; LibTorch " << built.torch
              << ", " << built.compiler << ", " << built.stdlib << ")\n";
    return 0;
  }
  const std::map<std::string, int (*)(const cli::Args&)> commands = {
      {"train", cli::train_command},
      {"validate", cli::validate_command},
      {"eval", cli::eval_command},
      {"generate", cli::generate_command},
      {"chat", cli::chat_command},
      {"plan", cli::plan_command},
      {"prepare-data", cli::prepare_data_command},
      {"components", cli::components_command},
      {"describe", cli::describe_command},
      {"schema", cli::schema_command},
      {"new-plugin", cli::new_plugin_command},
      {"launch", cli::launch_command},
  };
  auto it = commands.find(argv[1]);
  if (it == commands.end()) {
    std::cerr << "tessera: unknown command '" << argv[1] << "'\n\n" << kUsage;
    return 2;
  }
  cli::Args args(argv + 2, argv + argc);
  try {
    return it->second(args);
  } catch (const cli::UsageError& e) {
    std::cerr << "tessera " << argv[1] << ": " << e.what() << " (see tessera " << argv[1] << " --help)\n";
    return 2;
  } catch (const ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const core::PluginLoadError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    // LibTorch's own errors: the message without its C++ backtrace.
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
