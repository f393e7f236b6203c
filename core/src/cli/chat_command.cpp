// `tessera chat SPEC`: a conversation with a spec's model in the terminal, rendered with its chat
// template, each reply printed as it is generated. /reset forgets the conversation, /exit (or the
// end of input) ends it.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <iostream>

#include "commands.hpp"
#include "generation_io.hpp"
#include "tessera/error.hpp"

namespace po = boost::program_options;

namespace tessera::cli {

int chat_command(const Args& args) {
  core::RunOptions run_options;
  SamplingFlags flags;
  std::string system;
  po::options_description visible(
      "usage: tessera chat SPEC [options]\n\n"
      "Talk with the spec's model: each line you type is a user turn, the reply streams back. The\n"
      "conversation is rendered with the model's chat template (else sft_jsonl's ROLE: CONTENT lines).\n"
      "/reset starts a new conversation, /exit (or end of input) quits.\n\noptions");
  visible.add_options()
      ("set", po::value<std::vector<std::string>>(&run_options.overrides)->composing(), "override a value of the spec")
      ("plugin-path", po::value<std::vector<std::string>>(&run_options.plugin_paths)->composing(),
       "also search DIR for plugins")
      ("resume", po::value<std::string>(&run_options.resume),
       "the weights of a checkpoint: 'auto' (the newest valid one under checkpoint.dir) or its PATH")
      ("system", po::value<std::string>(&system), "a system message that opens every conversation");
  add_sampling_options(visible, flags, /*batches=*/false);
  visible.add_options()("help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("config", po::value<std::string>(&run_options.config_path));
  po::positional_options_description positional;
  positional.add("config", 1);
  if (!parse_command_line(args, visible, hidden, positional)) return 0;
  if (run_options.config_path.empty()) throw UsageError("missing SPEC (a run spec YAML file)");
  check_sampling_flags(flags);

  core::GenerationRun run(run_options);
  if (run.plan().env.world_size > 1) {
    throw UsageError("chat reads the terminal in one process; to split a model over ranks, run tessera generate "
                     "under tessera launch");
  }
  run.start();
  if (!run.tokenizer()) {
    throw ConfigError(run_options.config_path + ": chat needs a tokenizer, and the spec has none; add "
                      "components.tokenizer (e.g. {component_key: tokenizer, variant_key: bytes})", "");
  }
  nlohmann::json messages = nlohmann::json::array();
  const auto reset = [&] {
    messages = nlohmann::json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  };
  reset();
  std::cerr << "chatting with " << run.plan().source << " (" << (run.chat_template() ? "its chat template" : "plain ROLE: lines")
            << "); /reset starts over, /exit quits\n";
  std::int64_t turn = 0;
  for (std::string line;;) {
    std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      reset();
      std::cout << "(a new conversation)\n";
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    GenerationRequest request;
    try {
      request.prompt_ids = conversation_ids(run, messages.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      request.max_new_tokens = new_token_budget(flags.max_new_tokens, static_cast<std::int64_t>(request.prompt_ids.size()),
                                                run.model().max_seq_len(), "");
    } catch (const std::exception& e) {
      messages.erase(messages.end() - 1);
      std::cout << "(" << e.what() << "; /reset to start a new conversation)\n";
      continue;
    }
    request.sampling = sampling_of(flags, flags.seed + turn++);
    TextStream stream(*run.tokenizer(), run.eos_token_ids(), flags.stops);
    GenerationOptions options = generation_options(run, flags);
    options.after_token = [&](std::size_t, const std::vector<std::int64_t>& completion) {
      std::cout << stream.next(completion, false) << std::flush;
      return stream.stopped();
    };
    const GenerationResult result = run.generate({request}, options).front();
    std::cout << stream.next(result.completion_ids, true) << "\n";
    messages.push_back({{"role", "assistant"},
                        {"content", completion_text(*run.tokenizer(), result.completion_ids, run.eos_token_ids(),
                                                    flags.stops)}});
  }
  std::cout << "\n";
  run.finish();
  return 0;
}

}  // namespace tessera::cli
