// `tessera train` and `tessera validate`.
#include <boost/program_options.hpp>

#include <iostream>

#include "commands.hpp"
#include "tessera/core/process/stop_signal.hpp"
#include "tessera/core/run/training_run.hpp"

namespace po = boost::program_options;

namespace tessera::cli {
namespace {

struct Parsed {
  core::RunOptions options;
  bool help = false;
};

Parsed parse_run_args(const Args& args, const char* command, bool with_run_dir) {
  Parsed parsed;
  po::options_description visible(std::string("usage: tessera ") + command +
                                  " CONFIG [options]\n\noptions");
  visible.add_options()
      ("set", po::value<std::vector<std::string>>(&parsed.options.overrides)->composing(),
       "override a value: --set trainer.max_steps=50 (VALUE is YAML)")
      ("plugin-path", po::value<std::vector<std::string>>(&parsed.options.plugin_paths)->composing(),
       "also search DIR for plugins (after the spec's plugins.paths)")
      ("help,h", "show this help");
  if (with_run_dir) {
    visible.add_options()("run-dir", po::value<std::string>(&parsed.options.run_dir),
                          "write the run here instead of settings.run_dir")
        ("resume", po::value<std::string>(&parsed.options.resume),
         "continue from a checkpoint: 'auto' (the newest valid one under checkpoint.dir, or start "
         "fresh when there is none) or the PATH of one");
  }
  po::options_description hidden;
  hidden.add_options()("config", po::value<std::string>(&parsed.options.config_path));
  po::positional_options_description positional;
  positional.add("config", 1);
  if (!parse_command_line(args, visible, hidden, positional)) {
    parsed.help = true;
  } else if (parsed.options.config_path.empty()) {
    throw UsageError("missing CONFIG (a run spec YAML file)");
  }
  return parsed;
}

}  // namespace

bool parse_command_line(const Args& args, const po::options_description& visible,
                        const po::options_description& hidden, const po::positional_options_description& positional) {
  po::options_description all;
  all.add(visible).add(hidden);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  if (vm.count("help")) {
    std::cout << visible << "\n";
    return false;
  }
  return true;
}

int train_command(const Args& args) {
  Parsed parsed = parse_run_args(args, "train", true);
  if (parsed.help) return 0;
  core::TrainingRun run(parsed.options);
  core::install_stop_signal_handlers();
  run.train();
  return 0;
}

int validate_command(const Args& args) {
  Parsed parsed = parse_run_args(args, "validate", false);
  if (parsed.help) return 0;
  core::TrainingRun run(parsed.options);
  std::cout << parsed.options.config_path << ": ok (" << run.plugins().plugins().size()
            << " plugins loaded, every component validated)\n";
  return 0;
}

}  // namespace tessera::cli
