// The `tessera` subcommands. Each returns the process exit code: 0 ok, 2 bad config or usage,
// 1 failure at run time. Errors are thrown; main() turns them into one line and a code.
#pragma once

#include <boost/program_options.hpp>

#include <string>
#include <vector>

namespace tessera::cli {

// Thrown for a bad command line (exit code 2).
struct UsageError : std::exception {
  explicit UsageError(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
};

using Args = std::vector<std::string>;

// Parses `args` against `visible` (what --help shows) and `hidden` (the positional arguments,
// bound in `positional`). Prints the help and returns false for --help; throws UsageError for
// anything it cannot parse.
bool parse_command_line(const Args& args, const boost::program_options::options_description& visible,
                        const boost::program_options::options_description& hidden,
                        const boost::program_options::positional_options_description& positional);

int train_command(const Args& args);
int validate_command(const Args& args);
int eval_command(const Args& args);
int plan_command(const Args& args);
int prepare_data_command(const Args& args);
int components_command(const Args& args);
int describe_command(const Args& args);
int schema_command(const Args& args);
int new_plugin_command(const Args& args);
int launch_command(const Args& args);
int generate_command(const Args& args);
int chat_command(const Args& args);

}  // namespace tessera::cli
