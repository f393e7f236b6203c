// Dataset `preference_jsonl`: pairs for preference optimisation (loss/dpo) from JSON lines
// {"prompt", "chosen", "rejected"} or the same columns of Parquet files, Arrow files or a
// `datasets` folder (example_rows.hpp), as text or as messages (the prompt the conversation so far, the
// chosen and rejected the assistant's turn), written with the model's chat template like
// dataset/sft_jsonl (chat_encoding.hpp). A pair is two rows, chosen then rejected, sharing the
// prompt's tokens; only the completion's tokens are targets. A batch of n rows holds n / 2 pairs
// and counts its pairs as its num_target_tokens: the loss of a step is then the mean over every
// pair of the step, all micro-batches and ranks.
#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat_encoding.hpp"
#include "example_rows.hpp"
#include "seeded_order.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"
#include "tessera/run/batch.hpp"

namespace {

using Json = nlohmann::ordered_json;

struct PreferenceConfig : tessera::chat::ChatFormatConfig, tessera::chat::ExampleFilesConfig {
  std::shared_ptr<tessera::Tokenizer> tokenizer;
  std::int64_t seq_len = 1;
  std::int64_t max_prompt_length = 0;
  std::int64_t max_completion_length = 0;
  bool shuffle = true;
  std::int64_t seed = -1;

  static void declare(tessera::ConfigFields<PreferenceConfig>& f) {
    using C = PreferenceConfig;
    declare_file_fields(f,
                        "JSON lines {prompt, chosen, rejected}: texts, or messages (prompt: the conversation so far; "
                        "chosen, rejected: the assistant's turn, a message or its content)");
    f.field("tokenizer", &C::tokenizer, "the tokenizer of the model");
    f.field("seq_len", &C::seq_len, "tokens per row (a prompt and one completion)").required().at_least(2);
    f.field("max_prompt_length", &C::max_prompt_length,
            "keep the prompt's last this many tokens (TRL's max_prompt_length; 0: no limit of its own)")
        .at_least(0);
    f.field("max_completion_length", &C::max_completion_length,
            "keep a completion's first this many tokens (0: no limit of its own)")
        .at_least(0);
    f.field("shuffle", &C::shuffle, "a new seeded order of pairs every epoch");
    f.field("seed", &C::seed, "seed of the order; -1 = the run seed").at_least(-1);
    declare_chat_fields(f);
  }
};

struct Pair {
  std::vector<std::int64_t> prompt, chosen, rejected;
};

// chosen / rejected as messages: a list, one message, or the assistant's content.
Json as_messages(const Json& v, const std::string& what) {
  if (v.is_array()) return v;
  if (v.is_object()) return Json::array({v});
  if (v.is_string()) return Json::array({{{"role", "assistant"}, {"content", v}}});
  throw tessera::Error("'" + what + "' is neither messages, a message nor a text");
}

class PreferenceDataset final : public tessera::Dataset {
 public:
  PreferenceDataset(const PreferenceConfig& c, std::uint64_t run_seed)
      : seq_len_(c.seq_len),
        shuffle_(c.shuffle),
        seed_(c.seed < 0 ? run_seed : static_cast<std::uint64_t>(c.seed)),
        order_(shuffle_, seed_) {
    if (!c.tokenizer) throw tessera::ConfigError("dataset/preference_jsonl needs the model's tokenizer", "tokenizer");
    const tessera::chat::ChatEncoder chat(*c.tokenizer, c);
    eos_ = c.tokenizer->eos_id();
    pad_ = eos_ >= 0 ? eos_ : 0;
    std::size_t cut = 0, chats = 0;
    const std::vector<std::string> columns{"prompt", "chosen", "rejected", c.tools_field};
    tessera::chat::for_each_row(c, columns, [&](const Json& row, const std::string& where) {
      for (const char* field : {"prompt", "chosen", "rejected"}) {
        if (!row.contains(field)) throw tessera::ConfigError(where + ": no field '" + field + "'", "path");
      }
      Pair pair;
      try {
        const auto tools = row.find(c.tools_field);
        const bool text = row["prompt"].is_string() && row["chosen"].is_string() && row["rejected"].is_string();
        pair = text ? text_pair(chat, row) : chat_pair(chat, row, tools == row.end() || tools->is_null() ? nullptr : &*tools);
        chats += text ? 0 : 1;
      } catch (const tessera::ConfigError&) {
        throw;
      } catch (const tessera::Error& e) {
        throw tessera::ConfigError(where + ": " + e.what(), "path");
      }
      if (pair.chosen.empty() || pair.rejected.empty()) {
        throw tessera::ConfigError(where + ": a completion has no tokens", "path");
      }
      cut += fit(pair, c) ? 1 : 0;
      add(pair);
    });
    if (pairs_.empty()) throw tessera::ConfigError(c.path + " holds no pairs", "path");
    if (cut > 0) {
      tessera::log::info("dataset/preference_jsonl: ", cut, " of ", pairs_.size(), " pairs of ", c.path,
                         " cut to seq_len ", seq_len_, " (prompts from the left, then completions at the end)");
    }
    if (chats > 0) {
      tessera::log::info("dataset/preference_jsonl: ", chats, " pairs of messages of ", c.path, " written with ",
                         chat.describe());
    }
    std::vector<Row> rows;
    for (const auto& pair : pairs_) rows.insert(rows.end(), pair.begin(), pair.end());
    layout_ = tessera::chat::layout_of(rows, num_samples(), seq_len_, shuffle_, seed_);
  }

  void set_shard(std::int64_t rank, std::int64_t world_size) override {
    shard_.set(rank, world_size, "dataset/preference_jsonl");
  }

  // `batch_size` rows: batch_size / 2 pairs, each its chosen row then its rejected row.
  tessera::Batch next_batch(std::int64_t batch_size) override {
    if (batch_size < 2 || batch_size % 2 != 0) {
      throw tessera::Error("dataset/preference_jsonl gives pairs of rows (chosen, rejected): the micro-batch size "
                           "must be even, got " + std::to_string(batch_size) + " (trainer.micro_batch_size)");
    }
    at::Tensor input = at::empty({batch_size, seq_len_}, at::kLong);
    at::Tensor labels = at::empty({batch_size, seq_len_}, at::kLong);
    std::int64_t* in = input.mutable_data_ptr<std::int64_t>();
    std::int64_t* out = labels.mutable_data_ptr<std::int64_t>();
    for (std::int64_t p = 0; p < batch_size / 2; ++p) {
      const auto& rows = pairs_[order_.at(cursor_ + shard_.rank, static_cast<std::int64_t>(pairs_.size()))];
      cursor_ += shard_.world;
      for (std::int64_t k = 0; k < 2; ++k) {
        const Row& row = rows[static_cast<std::size_t>(k)];
        std::copy(row.inputs.begin(), row.inputs.end(), in + (2 * p + k) * seq_len_);
        std::copy(row.labels.begin(), row.labels.end(), out + (2 * p + k) * seq_len_);
      }
    }
    return {std::move(input), std::move(labels), batch_size / 2, at::Tensor()};
  }

  std::int64_t seq_len() const override { return seq_len_; }
  // Rows, as the trainer counts samples: two per pair.
  std::int64_t num_samples() const override { return 2 * static_cast<std::int64_t>(pairs_.size()); }

  tessera::StateDict state_dict() const override {
    return tessera::chat::position_state(cursor_, static_cast<std::int64_t>(pairs_.size()), layout_);
  }
  void load_state_dict(const tessera::StateDict& state) override {
    cursor_ = tessera::chat::position_from_state(state, static_cast<std::int64_t>(pairs_.size()), layout_,
                                                 "dataset/preference_jsonl", "pairs",
                                                 "another file, tokenizer, template or seq_len");
  }

 private:
  struct Row {
    std::vector<std::int64_t> inputs, labels;
  };

  // Texts: the tokenizer's BOS, the prompt; each completion and an EOS after it.
  Pair text_pair(const tessera::chat::ChatEncoder& chat, const Json& row) const {
    Pair pair;
    pair.prompt = chat.prefix();
    const auto prompt = chat.plain_ids(row["prompt"].get<std::string>());
    pair.prompt.insert(pair.prompt.end(), prompt.begin(), prompt.end());
    for (auto [field, ids] : {std::pair<const char*, std::vector<std::int64_t>*>{"chosen", &pair.chosen},
                              {"rejected", &pair.rejected}}) {
      *ids = chat.plain_ids(row[field].get<std::string>());
      if (eos_ >= 0) ids->push_back(eos_);
    }
    return pair;
  }

  // Messages: with a template, the prompt rendered with the generation prompt, and each
  // completion what the template writes after it for the whole conversation (as TRL's
  // maybe_apply_chat_template splits them); each part tokenised on its own. Without one, the
  // plain lines, the completion the assistant's content and an EOS.
  Pair chat_pair(const tessera::chat::ChatEncoder& chat, const Json& row, const Json* tools) const {
    const Json prompt = row["prompt"].is_string() ? Json::array({{{"role", "user"}, {"content", row["prompt"]}}})
                                                  : row["prompt"];
    if (!prompt.is_array() || prompt.empty()) throw tessera::Error("'prompt' is not a non-empty list of messages");
    Pair pair;
    if (!chat.templated()) {
      pair.prompt = chat.prefix();
      for (const auto& m : prompt) {
        const auto ids = chat.plain_ids(m.value("role", "") + ": " + m.value("content", "") + "\n");
        pair.prompt.insert(pair.prompt.end(), ids.begin(), ids.end());
      }
      const auto header = chat.plain_ids("assistant: ");
      pair.prompt.insert(pair.prompt.end(), header.begin(), header.end());
      for (auto [field, ids] : {std::pair<const char*, std::vector<std::int64_t>*>{"chosen", &pair.chosen},
                                {"rejected", &pair.rejected}}) {
        const Json turn = as_messages(row[field], field);
        if (turn.size() != 1 || !turn[0].contains("content") || !turn[0]["content"].is_string()) {
          throw tessera::Error(std::string("without a chat template '") + field + "' must be one assistant message");
        }
        *ids = chat.plain_ids(turn[0]["content"].get<std::string>());
        if (eos_ >= 0) ids->push_back(eos_);
      }
      return pair;
    }
    std::string prompt_text;
    pair.prompt = chat.render_ids(prompt, tools, /*add_generation_prompt=*/true, &prompt_text);
    for (auto [field, ids] : {std::pair<const char*, std::vector<std::int64_t>*>{"chosen", &pair.chosen},
                              {"rejected", &pair.rejected}}) {
      Json whole = prompt;
      for (const auto& m : as_messages(row[field], field)) whole.push_back(m);
      std::string text;
      chat.render_ids(whole, tools, /*add_generation_prompt=*/false, &text);
      if (text.compare(0, prompt_text.size(), prompt_text) != 0) {
        throw tessera::Error(std::string("the template writes the prompt otherwise once the '") + field +
                             "' turn follows it, so the completion cannot be cut from it");
      }
      *ids = chat.template_text_ids(text.substr(prompt_text.size()));
    }
    return pair;
  }

  // Prompt and longer completion within seq_len + 1 tokens (a row's inputs and its last label):
  // the prompt's own limit (its last tokens kept), the completions' (their first kept), then the
  // prompt cut from the left (one token at least), then the completions at the end.
  bool fit(Pair& pair, const PreferenceConfig& c) const {
    bool cut = false;
    const auto keep_last = [&](std::vector<std::int64_t>& v, std::size_t n) {
      if (v.size() > n) v.erase(v.begin(), v.end() - static_cast<std::ptrdiff_t>(n)), cut = true;
    };
    const auto keep_first = [&](std::vector<std::int64_t>& v, std::size_t n) {
      if (v.size() > n) v.resize(n), cut = true;
    };
    if (c.max_prompt_length > 0) keep_last(pair.prompt, static_cast<std::size_t>(c.max_prompt_length));
    if (c.max_completion_length > 0) {
      keep_first(pair.chosen, static_cast<std::size_t>(c.max_completion_length));
      keep_first(pair.rejected, static_cast<std::size_t>(c.max_completion_length));
    }
    const auto room = static_cast<std::size_t>(seq_len_ + 1);
    const std::size_t longest = std::max(pair.chosen.size(), pair.rejected.size());
    if (pair.prompt.size() + longest > room) keep_last(pair.prompt, std::max<std::size_t>(1, room > longest ? room - longest : 1));
    keep_first(pair.chosen, room - pair.prompt.size());
    keep_first(pair.rejected, room - pair.prompt.size());
    return cut;
  }

  Row make_row(const std::vector<std::int64_t>& prompt, const std::vector<std::int64_t>& completion) const {
    std::vector<std::int64_t> tokens = prompt;
    tokens.insert(tokens.end(), completion.begin(), completion.end());
    Row row;
    row.inputs.assign(tokens.begin(), tokens.end() - 1);
    for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
      row.labels.push_back(i + 1 >= prompt.size() ? tokens[i + 1] : tessera::kIgnoreIndex);
    }
    row.inputs.resize(static_cast<std::size_t>(seq_len_), pad_);
    row.labels.resize(static_cast<std::size_t>(seq_len_), tessera::kIgnoreIndex);
    return row;
  }

  void add(const Pair& pair) { pairs_.push_back({make_row(pair.prompt, pair.chosen), make_row(pair.prompt, pair.rejected)}); }

  std::int64_t seq_len_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t eos_ = -1, pad_ = 0;
  std::vector<std::int64_t> layout_;
  std::vector<std::array<Row, 2>> pairs_;
  std::int64_t cursor_ = 0;
  tessera::chat::Shard shard_;
  tessera::chat::SeededOrder order_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Dataset, PreferenceConfig>(
      "preference_jsonl", "pairs of a prompt with a chosen and a rejected completion, for preference optimisation",
      [](const PreferenceConfig& c, const tessera::RunContext& run) {
        return std::make_shared<PreferenceDataset>(c, run.seed);
      });
}

}  // namespace

TESSERA_PLUGIN("dataset_preference_jsonl", "0.1.0", register_components)
