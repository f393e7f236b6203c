// `tessera train`, `tessera validate` and `tessera eval`.
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "tessera/core/config/field_reader.hpp"
#include "tessera/core/process/stop_signal.hpp"
#include "tessera/core/run/training_run.hpp"

namespace po = boost::program_options;

namespace tessera::cli {
namespace {

struct Parsed {
  core::RunOptions options;
  core::EvalOptions eval;
  bool help = false;
  bool skip_path_checks = false;  // validate --skip-path-checks
};

enum class Command { train, validate, eval };

Parsed parse_run_args(const Args& args, const char* command, Command which) {
  const bool with_run_dir = which == Command::train;
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
  if (which == Command::validate) {
    visible.add_options()("skip-path-checks", po::bool_switch(&parsed.skip_path_checks),
                          "do not check that the files and folders the spec reads exist (for a spec whose data "
                          "is made later)");
  }
  if (which == Command::eval) {
    visible.add_options()
        ("resume", po::value<std::string>(&parsed.options.resume),
         "evaluate the model of a checkpoint: 'auto' (the newest valid one under checkpoint.dir; the model "
         "as built when there is none) or the PATH of one. Without it: the model as built (init_from)")
        ("split", po::value<std::string>(&parsed.eval.split)->default_value("eval"),
         "eval: the data of the spec's evaluation callback; train: components.train_data")
        ("batches", po::value<std::int64_t>(&parsed.eval.batches)->default_value(10),
         "micro-batches to evaluate, from the start of the data, in all (split evenly over the ranks)")
        ("micro-batch-size", po::value<std::int64_t>(&parsed.eval.micro_batch_size)->default_value(0),
         "sequences per micro-batch (0: the evaluation callback's micro_batch_size, else trainer.micro_batch_size)");
  }
  po::options_description hidden;
  hidden.add_options()("config", po::value<std::string>(&parsed.options.config_path));
  po::positional_options_description positional;
  positional.add("config", 1);
  if (!parse_command_line(args, visible, hidden, positional)) {
    parsed.help = true;
  } else if (parsed.options.config_path.empty()) {
    throw UsageError("missing CONFIG (a run spec YAML file)");
  } else if (parsed.eval.split != "eval" && parsed.eval.split != "train") {
    throw UsageError("--split must be eval or train, got '" + parsed.eval.split + "'");
  } else if (parsed.eval.batches < 1) {
    throw UsageError("--batches must be at least 1");
  } else if (parsed.eval.micro_batch_size < 0) {
    throw UsageError("--micro-batch-size must be at least 1 (or 0 for the spec's)");
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
  Parsed parsed = parse_run_args(args, "train", Command::train);
  if (parsed.help) return 0;
  core::TrainingRun run(parsed.options);
  core::install_stop_signal_handlers();
  run.train();
  return 0;
}

int validate_command(const Args& args) {
  Parsed parsed = parse_run_args(args, "validate", Command::validate);
  if (parsed.help) return 0;
  core::set_path_checks(!parsed.skip_path_checks);
  core::TrainingRun run(parsed.options);
  run.check_adapters();
  std::cout << parsed.options.config_path << ": ok (" << run.plugins().plugins().size()
            << " plugins loaded, every component validated)\n";
  return 0;
}

int eval_command(const Args& args) {
  Parsed parsed = parse_run_args(args, "eval", Command::eval);
  if (parsed.help) return 0;
  parsed.options.evaluate_only = true;
  core::TrainingRun run(parsed.options);
  const EvalTotals totals = run.evaluate(parsed.eval);
  if (run.plan().env.rank == 0) {
    char line[256];
    std::snprintf(line, sizeof line, "{\"loss\": %.17g, \"tokens\": %.0f, \"batches\": %lld", totals.mean_loss(),
                  totals.target_tokens, static_cast<long long>(totals.batches));
    std::string text = line;
    // The loss's own metrics under TRL's evaluation names (eval_rewards/chosen, eval_logps/chosen, ...).
    for (const auto& [name, value] : totals.metrics) {
      std::snprintf(line, sizeof line, ", \"eval_%s\": %.17g", name.c_str(), value);
      text += line;
    }
    std::cout << text << "}" << std::endl;
  }
  return 0;
}

}  // namespace tessera::cli
