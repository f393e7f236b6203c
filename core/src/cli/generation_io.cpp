#include "generation_io.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "commands.hpp"
#include "tessera/error.hpp"

namespace po = boost::program_options;

namespace tessera::cli {

void add_sampling_options(po::options_description& options, SamplingFlags& flags, bool batches) {
  options.add_options()
      ("max-new-tokens", po::value<std::int64_t>(&flags.max_new_tokens)->default_value(0),
       "tokens to generate at most (0: 128, or what the model's max_seq_len leaves)")
      ("temperature", po::value<double>(&flags.temperature)->default_value(1.0),
       "divides the logits; 0 is greedy")
      ("top-k", po::value<std::int64_t>(&flags.top_k)->default_value(0), "draw among the k likeliest tokens (0: all)")
      ("top-p", po::value<double>(&flags.top_p)->default_value(1.0),
       "draw among the likeliest tokens whose probabilities sum to p")
      ("min-p", po::value<double>(&flags.min_p)->default_value(0.0),
       "drop tokens less likely than min_p times the likeliest")
      ("seed", po::value<std::int64_t>(&flags.seed)->default_value(0),
       "seed of the draws (prompt i of a file: seed + i, unless its row has its own)")
      ("stop", po::value<std::vector<std::string>>(&flags.stops)->composing(),
       "end a completion where its text holds STR (repeatable); the text stops before it");
  if (batches) {
    options.add_options()("batch-size", po::value<std::int64_t>(&flags.batch_size)->default_value(8),
                          "prompts generated together (per data-parallel rank)");
  }
}

void check_sampling_flags(const SamplingFlags& flags) {
  if (flags.batch_size < 1) throw UsageError("--batch-size must be at least 1");
  if (flags.max_new_tokens < 0) throw UsageError("--max-new-tokens must be at least 1 (or 0 for the default)");
  for (const auto& stop : flags.stops) {
    if (stop.empty()) throw UsageError("--stop needs a non-empty string");
  }
  try {
    check_sampling(sampling_of(flags, 0));
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

GenerationOptions generation_options(const core::GenerationRun& run, const SamplingFlags& flags) {
  GenerationOptions options;
  options.eos_token_ids = run.eos_token_ids();
  options.batch_size = flags.batch_size;
  // Ids past the tokenizer's (a vocabulary padded to a multiple of 64) have no text.
  if (run.tokenizer()) options.vocabulary = run.tokenizer()->vocab_size();
  return options;
}

SamplingParams sampling_of(const SamplingFlags& flags, std::int64_t seed) {
  SamplingParams s;
  s.temperature = flags.temperature;
  s.top_k = flags.top_k;
  s.top_p = flags.top_p;
  s.min_p = flags.min_p;
  s.seed = static_cast<std::uint64_t>(seed);
  return s;
}

std::int64_t new_token_budget(std::int64_t asked, std::int64_t prompt, std::int64_t max_seq_len,
                              const std::string& where) {
  const std::int64_t room = max_seq_len - prompt;
  if (room < 1) {
    throw ConfigError(where + "the prompt's " + std::to_string(prompt) + " tokens leave no room under the model's "
                      "max_seq_len " + std::to_string(max_seq_len) + "; shorten it", "");
  }
  if (asked == 0) return std::min<std::int64_t>(128, room);
  if (asked < 0) throw ConfigError(where + "max_new_tokens must be at least 1", "");
  if (asked > room) {
    throw ConfigError(where + "a prompt of " + std::to_string(prompt) + " tokens and max_new_tokens " +
                          std::to_string(asked) + " pass the model's max_seq_len " + std::to_string(max_seq_len) +
                          "; shorten the prompt or lower max_new_tokens to " + std::to_string(room),
                      "");
  }
  return asked;
}

std::vector<std::int64_t> conversation_ids(const core::GenerationRun& run, const std::string& messages_json) {
  const Tokenizer& tokenizer = *run.tokenizer();
  if (run.chat_template()) {
    text::ChatOptions options;
    options.add_generation_prompt = true;
    return encode_written_text(tokenizer, run.chat_template()->render(messages_json, options));
  }
  // sft_jsonl's format without a template: what encode() puts first (a BOS), each message as
  // "ROLE: CONTENT\n" (an assistant's content followed by the EOS), then the assistant's turn.
  std::vector<std::int64_t> ids = tokenizer.encode("");
  ids.erase(std::find_if(ids.begin(), ids.end(), [&](std::int64_t id) { return id != tokenizer.bos_id(); }), ids.end());
  const auto add = [&](const std::string& text) {
    const std::vector<std::int64_t> piece = encode_written_text(tokenizer, text);
    ids.insert(ids.end(), piece.begin(), piece.end());
  };
  for (const auto& message : nlohmann::json::parse(messages_json)) {
    const std::string role = message.at("role").get<std::string>(), content = message.at("content").get<std::string>();
    if (role != "assistant") {
      add(role + ": " + content + "\n");
      continue;
    }
    add("assistant: ");
    add(content);
    if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
    add("\n");
  }
  add("assistant: ");
  return ids;
}

std::size_t first_stop(const std::string& text, const std::vector<std::string>& stops) {
  std::size_t first = std::string::npos;
  for (const auto& stop : stops) first = std::min(first, text.find(stop));
  return first;
}

bool reaches_stop(const Tokenizer& tokenizer, const std::vector<std::int64_t>& completion,
                  const std::vector<std::string>& stops) {
  std::size_t longest = 0;
  for (const auto& stop : stops) longest = std::max(longest, stop.size());
  const std::size_t tail = std::min(completion.size(), longest + 2);
  const std::vector<std::int64_t> last(completion.end() - static_cast<std::ptrdiff_t>(tail), completion.end());
  return first_stop(tokenizer.decode(last), stops) != std::string::npos;
}

std::string completion_text(const Tokenizer& tokenizer, const std::vector<std::int64_t>& completion_ids,
                            const std::vector<std::int64_t>& end_ids, const std::vector<std::string>& stops) {
  std::vector<std::int64_t> ids = completion_ids;
  if (!ids.empty() && std::find(end_ids.begin(), end_ids.end(), ids.back()) != end_ids.end()) ids.pop_back();
  std::string text = tokenizer.decode(ids);
  const std::size_t stop = first_stop(text, stops);
  if (stop != std::string::npos) text.resize(stop);
  return text;
}

namespace {

// Bytes at the end of `text` that may still change: an unfinished UTF-8 character, or the
// replacement characters a decoder wrote for one (sentencepiece's byte fallback: one a byte).
std::size_t unsettled_tail(const std::string& text) {
  static const std::string replacement = "\xEF\xBF\xBD";
  std::size_t run = 0;
  while (text.size() >= run + 3 && text.compare(text.size() - run - 3, 3, replacement) == 0) run += 3;
  if (run > 0) return run;
  for (std::size_t back = 1; back <= std::min<std::size_t>(3, text.size()); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    return length > back ? back : 0;
  }
  return 0;
}

// The longest end of `text` that begins one of `stops` (and is not all of it).
std::size_t stop_prefix_tail(const std::string& text, const std::vector<std::string>& stops) {
  std::size_t held = 0;
  for (const auto& stop : stops) {
    for (std::size_t k = std::min(stop.size() - 1, text.size()); k > held; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        held = k;
        break;
      }
    }
  }
  return held;
}

}  // namespace

std::string TextStream::next(const std::vector<std::int64_t>& completion, bool final) {
  if (stopped_) return {};
  std::string text = completion_text(tokenizer_, completion, end_ids_, {});
  std::size_t end = text.size();
  if (const std::size_t stop = first_stop(text, stops_); stop != std::string::npos) {
    stopped_ = true;
    end = stop;
  } else if (!final) {
    end -= std::max(unsettled_tail(text), stop_prefix_tail(text, stops_));
  }
  if (end <= given_) return {};
  std::string piece = text.substr(given_, end - given_);
  given_ = end;
  return piece;
}

}  // namespace tessera::cli
