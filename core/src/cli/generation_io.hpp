// What `tessera generate` and `tessera chat` share: the sampling flags, prompts made token ids
// (a conversation rendered with the model's chat template), a completion's text with its stop
// strings applied, and text streamed while it is generated.
#pragma once

#include <boost/program_options.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/components/tokenizer.hpp"
#include "tessera/core/run/generation_run.hpp"
#include "tessera/generation/generate.hpp"

namespace tessera::cli {

struct SamplingFlags {
  std::int64_t max_new_tokens = 0;  // 0: 128, or what room max_seq_len leaves when less
  double temperature = 1.0;
  std::int64_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  std::int64_t seed = 0;
  std::vector<std::string> stops;  // --stop
  std::int64_t batch_size = 8;
};

// The sampling flags (and --batch-size where `batches`: a command generating many prompts).
void add_sampling_options(boost::program_options::options_description& options, SamplingFlags& flags, bool batches);
// UsageError for flags no generation can take (a temperature below 0, an empty --stop, ...).
void check_sampling_flags(const SamplingFlags& flags);
// The options every command generates with: the run's EOS ids, and draws kept to the
// tokenizer's ids where the model's vocabulary is padded past them.
GenerationOptions generation_options(const core::GenerationRun& run, const SamplingFlags& flags);

// The defaults a row or a turn starts from: the flags' sampling, `seed`.
SamplingParams sampling_of(const SamplingFlags& flags, std::int64_t seed);

// max_new_tokens for a prompt of `prompt` tokens: `asked` (0: the default, 128 or the room left),
// refused (ConfigError led by `where`) when the prompt and it pass the model's max_seq_len.
std::int64_t new_token_budget(std::int64_t asked, std::int64_t prompt, std::int64_t max_seq_len, const std::string& where);

// A conversation (a JSON list of messages) as the ids the model continues: rendered by the chat
// template with its generation prompt, else in sft_jsonl's plain format (ROLE: CONTENT lines,
// then "assistant: ").
std::vector<std::int64_t> conversation_ids(const core::GenerationRun& run, const std::string& messages_json);

// Where the first of `stops` begins in `text` (std::string::npos: none does).
std::size_t first_stop(const std::string& text, const std::vector<std::string>& stops);
// Whether the completion's text, grown by its last token, now holds one of `stops`: the decode of
// its last tokens, as many as the longest stop has bytes and two more, is searched (a stop string
// found earlier would have ended the completion there).
bool reaches_stop(const Tokenizer& tokenizer, const std::vector<std::int64_t>& completion,
                  const std::vector<std::string>& stops);

// A completion as a reader sees it: decoded without the EOS that ended it (one of `end_ids`),
// cut before the first stop string.
std::string completion_text(const Tokenizer& tokenizer, const std::vector<std::int64_t>& completion_ids,
                            const std::vector<std::int64_t>& end_ids, const std::vector<std::string>& stops);

// The text of a completion while it grows, handed out in pieces that never change afterwards:
// a tail that may yet begin a stop string is held back, as is an unfinished UTF-8 character
// (a byte-level token's), and nothing past a stop string is given.
class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::int64_t> end_ids, std::vector<std::string> stops)
      : tokenizer_(tokenizer), end_ids_(std::move(end_ids)), stops_(std::move(stops)) {}
  // The new text `completion` (all the ids so far) adds; `final`: the completion ended.
  std::string next(const std::vector<std::int64_t>& completion, bool final);
  // Whether the text so far holds a stop string.
  bool stopped() const { return stopped_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::int64_t> end_ids_;
  std::vector<std::string> stops_;
  std::size_t given_ = 0;
  bool stopped_ = false;
};

}  // namespace tessera::cli
