// `tessera generate SPEC (--prompt TEXT | --prompts FILE)`: completions of a spec's model, one
// JSON line per prompt (or, for --prompt, the text as it is generated).
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

#include "commands.hpp"
#include "generation_io.hpp"
#include "tessera/error.hpp"

namespace po = boost::program_options;

namespace tessera::cli {
namespace {

struct GenerateArgs {
  core::RunOptions run;
  std::string prompt, prompts_file, out;
  SamplingFlags sampling;
};

// One prompt of the file, made a request. Errors name the file, the line and the row.
class PromptRows {
 public:
  PromptRows(const core::GenerationRun& run, const SamplingFlags& flags) : run_(run), flags_(flags) {}

  std::vector<GenerationRequest> read(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw ConfigError("cannot read the prompts file " + path, "");
    std::vector<GenerationRequest> requests;
    std::size_t line_number = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      where_ = path + ":" + std::to_string(line_number) + ": row " + std::to_string(requests.size()) + ": ";
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (row.is_discarded() || !row.is_object()) fail("not a JSON object");
      requests.push_back(request_of(row, requests.size()));
    }
    if (requests.empty()) {
      throw ConfigError(path + ": holds no prompts; write one JSON object a line, each {\"prompt\": TEXT}, "
                        "{\"messages\": [...]} or {\"prompt_ids\": [...]}", "");
    }
    return requests;
  }

  GenerationRequest text_prompt(const std::string& text) {
    where_ = "--prompt: ";
    return request_of(nlohmann::json{{"prompt", text}}, 0);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw ConfigError(where_ + what, ""); }

  GenerationRequest request_of(const nlohmann::json& row, std::size_t index) const {
    static const std::vector<std::string> known = {"prompt", "messages", "prompt_ids", "max_new_tokens", "temperature",
                                                   "seed"};
    int prompts = 0;
    for (const auto& item : row.items()) {
      if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
        fail("unknown field '" + item.key() + "'; a row holds prompt, messages or prompt_ids, and may hold "
             "max_new_tokens, temperature and seed");
      }
      prompts += item.key() == "prompt" || item.key() == "messages" || item.key() == "prompt_ids";
    }
    if (prompts != 1) fail("give exactly one of prompt, messages and prompt_ids");
    GenerationRequest request;
    request.prompt_ids = prompt_ids(row);
    if (request.prompt_ids.empty()) fail("the prompt has no tokens");
    for (const std::int64_t id : request.prompt_ids) {
      if (id < 0 || id >= run_.model().vocab_size()) {
        fail("token id " + std::to_string(id) + " is outside the model's vocabulary of " +
             std::to_string(run_.model().vocab_size()));
      }
    }
    const std::int64_t asked = integer(row, "max_new_tokens", flags_.max_new_tokens, 1);
    request.max_new_tokens = new_token_budget(asked, static_cast<std::int64_t>(request.prompt_ids.size()),
                                              run_.model().max_seq_len(), where_);
    request.sampling = sampling_of(flags_, integer(row, "seed", flags_.seed + static_cast<std::int64_t>(index), 0));
    if (row.contains("temperature")) {
      const auto& t = row["temperature"];
      if (!t.is_number() || t.get<double>() < 0) fail("temperature must be a number, at least 0");
      request.sampling.temperature = t.get<double>();
    }
    return request;
  }

  std::int64_t integer(const nlohmann::json& row, const char* key, std::int64_t fallback, std::int64_t least) const {
    if (!row.contains(key)) return fallback;
    const auto& v = row[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() < least) {
      fail(std::string(key) + " must be an integer, at least " + std::to_string(least));
    }
    return v.get<std::int64_t>();
  }

  std::vector<std::int64_t> prompt_ids(const nlohmann::json& row) const {
    if (row.contains("prompt_ids")) {
      const auto& ids = row["prompt_ids"];
      std::vector<std::int64_t> out;
      if (!ids.is_array()) fail("prompt_ids must be a list of token ids");
      for (const auto& id : ids) {
        if (!id.is_number_integer()) fail("prompt_ids must be a list of token ids");
        out.push_back(id.get<std::int64_t>());
      }
      return out;
    }
    if (!run_.tokenizer()) {
      fail("a text prompt needs a tokenizer, and the spec has none; add components.tokenizer (e.g. "
           "{component_key: tokenizer, variant_key: bytes}) or give prompt_ids");
    }
    try {
      if (row.contains("prompt")) {
        if (!row["prompt"].is_string()) fail("prompt must be a string");
        return run_.tokenizer()->encode(row["prompt"].get<std::string>());
      }
      const auto& messages = row["messages"];
      if (!messages.is_array() || messages.empty()) fail("messages must be a non-empty list of {role, content}");
      for (const auto& m : messages) {
        if (!m.is_object() || !m.contains("role") || !m.contains("content")) {
          fail("messages must be a non-empty list of {role, content}");
        }
      }
      return conversation_ids(run_, messages.dump());
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }

  const core::GenerationRun& run_;
  const SamplingFlags& flags_;
  std::string where_;
};

GenerateArgs parse(const Args& args, bool& help) {
  GenerateArgs parsed;
  po::options_description visible(
      "usage: tessera generate SPEC (--prompt TEXT | --prompts FILE) [options]\n\n"
      "SPEC needs a model (and a tokenizer for text); the rest of a training spec is ignored. FILE holds\n"
      "JSON lines: {\"prompt\": TEXT}, {\"messages\": [...]} (rendered with the model's chat template) or\n"
      "{\"prompt_ids\": [...]}, each optionally with max_new_tokens, temperature and seed. Output: one JSON\n"
      "line per prompt, in order: {index, prompt_ids, completion_ids, text, logprobs, finish_reason}.\n\noptions");
  visible.add_options()
      ("set", po::value<std::vector<std::string>>(&parsed.run.overrides)->composing(),
       "override a value of the spec: --set components.model.config.init_from=DIR")
      ("plugin-path", po::value<std::vector<std::string>>(&parsed.run.plugin_paths)->composing(),
       "also search DIR for plugins")
      ("resume", po::value<std::string>(&parsed.run.resume),
       "the weights of a checkpoint: 'auto' (the newest valid one under checkpoint.dir; the model as built when "
       "there is none) or its PATH. Without it: the model as built (init_from)")
      ("prompt", po::value<std::string>(&parsed.prompt), "one prompt; its completion's text is printed as it comes")
      ("prompts", po::value<std::string>(&parsed.prompts_file), "a JSON-lines file of prompts")
      ("out", po::value<std::string>(&parsed.out), "write the JSON lines here instead of stdout");
  add_sampling_options(visible, parsed.sampling, /*batches=*/true);
  visible.add_options()("help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("config", po::value<std::string>(&parsed.run.config_path));
  po::positional_options_description positional;
  positional.add("config", 1);
  help = !parse_command_line(args, visible, hidden, positional);
  if (help) return parsed;
  if (parsed.run.config_path.empty()) throw UsageError("missing SPEC (a run spec YAML file)");
  if (parsed.prompt.empty() == parsed.prompts_file.empty()) throw UsageError("give one of --prompt TEXT and --prompts FILE");
  check_sampling_flags(parsed.sampling);
  return parsed;
}

nlohmann::ordered_json row_of(std::size_t index, const GenerationRequest& request, const GenerationResult& result,
                              const core::GenerationRun& run, const std::vector<std::string>& stops) {
  nlohmann::ordered_json row;
  row["index"] = index;
  row["prompt_ids"] = request.prompt_ids;
  row["completion_ids"] = result.completion_ids;
  row["text"] = run.tokenizer() ? nlohmann::ordered_json(completion_text(*run.tokenizer(), result.completion_ids,
                                                                         run.eos_token_ids(), stops))
                                : nlohmann::ordered_json(nullptr);
  row["logprobs"] = result.logprobs;
  row["finish_reason"] = result.finish_reason;
  return row;
}

}  // namespace

int generate_command(const Args& args) {
  bool help = false;
  const GenerateArgs parsed = parse(args, help);
  if (help) return 0;
  core::GenerationRun run(parsed.run);
  run.start();
  const std::vector<std::string>& stops = parsed.sampling.stops;
  if (!stops.empty() && !run.tokenizer()) {
    throw ConfigError(parsed.run.config_path + ": --stop reads the completions' text, which needs a tokenizer, and "
                      "the spec has none; add components.tokenizer", "");
  }
  PromptRows rows(run, parsed.sampling);
  const bool one_text = !parsed.prompt.empty();
  const std::vector<GenerationRequest> requests =
      one_text ? std::vector<GenerationRequest>{rows.text_prompt(parsed.prompt)} : rows.read(parsed.prompts_file);

  GenerationOptions options = generation_options(run, parsed.sampling);
  std::unique_ptr<TextStream> stream;
  if (one_text && run.rank() == 0) stream = std::make_unique<TextStream>(*run.tokenizer(), run.eos_token_ids(), stops);
  if (!stops.empty() || stream) {
    // Every rank decides alike (the same ids, the same tokenizer): tensor-parallel peers stay in step.
    options.after_token = [&](std::size_t, const std::vector<std::int64_t>& completion) {
      if (stream) std::cout << stream->next(completion, false) << std::flush;
      return !stops.empty() && reaches_stop(*run.tokenizer(), completion, stops);
    };
  }
  const std::vector<GenerationResult> results = run.generate(requests, options);
  if (run.rank() == 0) {
    if (stream) std::cout << stream->next(results.front().completion_ids, true) << std::endl;
    if (!one_text || !parsed.out.empty()) {
      std::ofstream file;
      if (!parsed.out.empty()) {
        file.open(parsed.out, std::ios::binary | std::ios::trunc);
        if (!file) throw Error("cannot write " + parsed.out);
      }
      std::ostream& out = parsed.out.empty() ? std::cout : file;
      for (std::size_t i = 0; i < results.size(); ++i) {
        // Text cut inside a character (a byte-level token's) is written with U+FFFD in its place.
        out << row_of(i, requests[i], results[i], run, stops).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << "\n";
      }
      out.flush();
      if (!out) throw Error("cannot write " + (parsed.out.empty() ? std::string("stdout") : parsed.out));
    }
  }
  run.finish();
  return 0;
}

}  // namespace tessera::cli
