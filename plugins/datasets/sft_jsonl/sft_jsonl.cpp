// Dataset `sft_jsonl`: supervised fine-tuning examples from JSON lines, {"prompt", "response"}
// or chat {"messages": [{"role", "content"}, ...]}, or the same columns of Parquet files, Arrow
// files or a `datasets` folder (example_rows.hpp), tokenised with the run's tokenizer. A chat is
// written with the model's own chat template where the tokenizer's folder has one (chat_encoding.hpp),
// else as 'ROLE: CONTENT' lines. Only the response (the assistant's turns) are targets: every other
// label is kIgnoreIndex, so the loss and the trainer's global token normalisation count response
// tokens only. Examples are packed into rows of seq_len (whole examples, greedily, in file order) or
// given a row each; the rows are read in a seeded order per epoch, shared across ranks like
// dataset/tokens. A tokenizer that adds BOS or EOS to every encode() (sentencepiece's add_bos,
// add_eos) gives them once per example: its BOS first, its EOS where the dataset places one.
#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat_encoding.hpp"
#include "example_rows.hpp"
#include "seeded_order.hpp"
#include "tessera/log.hpp"
#include "tessera/run/batch.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/plugin.hpp"

namespace {

struct SftConfig : tessera::chat::ChatFormatConfig, tessera::chat::ExampleFilesConfig {
  std::shared_ptr<tessera::Tokenizer> tokenizer;
  std::int64_t seq_len = 1;
  bool pack = true;
  bool document_mask = true;
  bool shuffle = true;
  std::int64_t seed = -1;
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string messages_field = "messages";

  static void declare(tessera::ConfigFields<SftConfig>& f) {
    using C = SftConfig;
    declare_file_fields(f, "JSON lines: {prompt, response} or {messages: [{role, content}, ...]}");
    f.field("tokenizer", &C::tokenizer, "the tokenizer of the model (its EOS ends every response)");
    f.field("seq_len", &C::seq_len, "tokens per row").required().at_least(1);
    f.field("pack", &C::pack, "pack whole examples into rows (else one example a row, padded)");
    f.field("document_mask", &C::document_mask,
            "give the model each position's example, so a model that masks documents keeps packed examples "
            "from attending to each other and restarts their positions");
    f.field("shuffle", &C::shuffle, "a new seeded order of rows every epoch");
    f.field("seed", &C::seed, "seed of the row order; -1 = the run seed").at_least(-1);
    f.field("prompt_field", &C::prompt_field, "the prompt's field");
    f.field("response_field", &C::response_field, "the response's field (the target)");
    f.field("messages_field", &C::messages_field,
            "the chat's field: messages written by the chat template (see chat_template), the assistant's turns "
            "the targets");
    declare_chat_fields(f);
  }
};

using tessera::chat::Example;

std::string string_field(const nlohmann::ordered_json& row, const std::string& name, const std::string& where) {
  auto it = row.find(name);
  if (it == row.end()) throw tessera::ConfigError(where + ": no field '" + name + "'", "path");
  if (!it->is_string()) throw tessera::ConfigError(where + ": field '" + name + "' is not a string", "path");
  return it->get<std::string>();
}

class SftDataset final : public tessera::Dataset {
 public:
  SftDataset(const SftConfig& c, std::uint64_t run_seed)
      : seq_len_(c.seq_len),
        document_mask_(c.document_mask),
        shuffle_(c.shuffle),
        seed_(c.seed < 0 ? run_seed : static_cast<std::uint64_t>(c.seed)),
        order_(shuffle_, seed_) {
    if (!c.tokenizer) throw tessera::ConfigError("dataset/sft_jsonl needs the model's tokenizer", "tokenizer");
    const tessera::Tokenizer& tok = *c.tokenizer;
    const tessera::chat::ChatEncoder chat(tok, c);
    eos_ = tok.eos_id();
    pad_ = eos_ >= 0 ? eos_ : 0;
    packs_added_specials_ = c.pack && !(chat.prefix().empty() && chat.suffix().empty());
    const std::vector<std::string> columns{c.messages_field, c.prompt_field, c.response_field, c.tools_field};
    tessera::chat::for_each_row(c, columns, [&](const nlohmann::ordered_json& row, const std::string& where) {
      Example ex;
      try {
        const auto messages = row.find(c.messages_field);
        if (messages != row.end() && !messages->is_null()) {  // a table's row may hold both kinds
          const auto tools = row.find(c.tools_field);
          ex = chat.encode(*messages, tools == row.end() || tools->is_null() ? nullptr : &*tools);
          chats_ += 1;
        } else {
          ex.add(chat.prefix(), false);
          ex.add(chat.plain_ids(string_field(row, c.prompt_field, where)), false);
          ex.add(chat.plain_ids(string_field(row, c.response_field, where)), true);
          if (eos_ >= 0) ex.add({eos_}, true);
        }
      } catch (const tessera::ConfigError&) {
        throw;
      } catch (const tessera::Error& e) {
        throw tessera::ConfigError(where + ": " + e.what(), "path");
      }
      add_example(ex, c.pack);
    });
    flush_row();
    if (rows_.empty()) throw tessera::ConfigError(c.path + " holds no examples", "path");
    if (chats_ > 0) tessera::log::info("dataset/sft_jsonl: " + std::to_string(chats_) + " chats of " + c.path + " written with " + chat.describe());
    layout_ = tessera::chat::layout_of(rows_, num_samples(), seq_len_, shuffle_, seed_);
  }

  void set_shard(std::int64_t rank, std::int64_t world_size) override { shard_.set(rank, world_size, "dataset/sft_jsonl"); }

  tessera::Batch next_batch(std::int64_t batch_size) override {
    if (batch_size < 1) throw tessera::Error("dataset/sft_jsonl: batch size must be >= 1");
    at::Tensor input = at::empty({batch_size, seq_len_}, at::kLong);
    at::Tensor labels = at::empty({batch_size, seq_len_}, at::kLong);
    std::int64_t* in = input.mutable_data_ptr<std::int64_t>();
    std::int64_t* out = labels.mutable_data_ptr<std::int64_t>();
    at::Tensor documents;
    if (document_mask_) documents = at::empty({batch_size, seq_len_}, at::kLong);
    std::int64_t targets = 0;
    for (std::int64_t b = 0; b < batch_size; ++b) {
      const Row& row = rows_[order_.at(cursor_ + shard_.rank, num_samples())];
      cursor_ += shard_.world;
      std::copy(row.inputs.begin(), row.inputs.end(), in + b * seq_len_);
      std::copy(row.labels.begin(), row.labels.end(), out + b * seq_len_);
      if (document_mask_) {
        std::copy(row.documents.begin(), row.documents.end(), documents.mutable_data_ptr<std::int64_t>() + b * seq_len_);
      }
      targets += row.targets;
    }
    return {std::move(input), std::move(labels), targets, std::move(documents)};
  }

  std::int64_t seq_len() const override { return seq_len_; }
  std::int64_t num_samples() const override { return static_cast<std::int64_t>(rows_.size()); }

  // With the position, what it is a position in (layout_): a resume over other rows is refused.
  tessera::StateDict state_dict() const override {
    return tessera::chat::position_state(cursor_, num_samples(), layout_);
  }
  void load_state_dict(const tessera::StateDict& state) override {
    const auto epoch = state.find("epoch"), position = state.find("position"), layout = state.find("layout");
    const std::size_t keys = layout == state.end() ? 2 : 3;  // a state from before layouts were saved has none
    if (epoch == state.end() || position == state.end() || state.size() != keys) {
      throw tessera::Error("dataset/sft_jsonl state: expected exactly the keys epoch, position and layout");
    }
    if (layout == state.end() && packs_added_specials_) {
      // Saved before layouts, by a version that gave each part of an example its own BOS/EOS:
      // the packed rows were others, so the position would pick other rows.
      throw tessera::Error(
          "dataset/sft_jsonl state has no layout and was saved by an earlier Tessera, which packed this "
          "tokenizer's BOS/EOS around every part of an example: the rows differ now. Start a new run from the "
          "checkpoint's weights (an export and the model's init_from)");
    }
    if (layout != state.end()) {
      const at::Tensor saved = layout->second.to(at::kLong).contiguous();
      const std::vector<std::int64_t> was(saved.const_data_ptr<std::int64_t>(), saved.const_data_ptr<std::int64_t>() + saved.numel());
      if (was != layout_) {
        throw tessera::Error("dataset/sft_jsonl state was saved reading " + describe(was) + "; this run reads " +
                             describe(layout_) +
                             ". Its position would pick other rows than the run has seen: resume with the file, "
                             "tokenizer and config it was saved with, or start a new run from the checkpoint's "
                             "weights (an export and the model's init_from)");
      }
    }
    const auto p = position->second.item<std::int64_t>(), e = epoch->second.item<std::int64_t>();
    if (e < 0 || p < 0 || p >= num_samples()) throw tessera::Error("dataset/sft_jsonl state: position outside an epoch");
    cursor_ = e * num_samples() + p;
  }

 private:
  struct Row {
    std::vector<std::int64_t> inputs, labels;
    std::vector<std::int64_t> documents;  // the example of each position (padding: one more)
    std::int64_t examples = 0;
    std::int64_t targets = 0;
  };

  // The layout as words: {rows, seq_len, shuffle, seed, checksum of the rows' tokens and labels}.
  static std::string describe(const std::vector<std::int64_t>& v) {
    if (v.size() != 5) return "a layout of " + std::to_string(v.size()) + " values (not 5)";
    char checksum_hex[16];
    std::snprintf(checksum_hex, sizeof checksum_hex, "%08x", static_cast<unsigned>(v[4]));
    return std::to_string(v[0]) + " rows of " + std::to_string(v[1]) + " tokens (checksum " + checksum_hex + "), " +
           (v[2] ? "shuffled with seed " + std::to_string(v[3]) : "in file order");
  }

  // Inputs are tokens[0..n-2]; label i is token i+1 where that token is a target.
  void add_example(const Example& ex, bool pack) {
    if (ex.tokens.size() < 2) return;
    std::size_t n = std::min(ex.tokens.size() - 1, static_cast<std::size_t>(seq_len_));
    if (!pack || open_.inputs.size() + n > static_cast<std::size_t>(seq_len_)) flush_row();
    for (std::size_t i = 0; i < n; ++i) {
      open_.documents.push_back(open_.examples);
      open_.inputs.push_back(ex.tokens[i]);
      const bool target = ex.target[i + 1];
      open_.labels.push_back(target ? ex.tokens[i + 1] : tessera::kIgnoreIndex);
      open_.targets += target ? 1 : 0;
    }
    ++open_.examples;
    if (!pack) flush_row();
  }

  // Pads the open row to seq_len (padding takes no loss) and keeps it if it holds a target.
  void flush_row() {
    if (open_.inputs.empty()) return;
    open_.inputs.resize(static_cast<std::size_t>(seq_len_), pad_);
    open_.labels.resize(static_cast<std::size_t>(seq_len_), tessera::kIgnoreIndex);
    open_.documents.resize(static_cast<std::size_t>(seq_len_), open_.examples);
    if (open_.targets > 0) rows_.push_back(std::move(open_));
    open_ = Row{};
  }

  std::int64_t seq_len_;
  bool document_mask_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t eos_ = -1, pad_ = 0;
  std::vector<std::int64_t> layout_;  // what a saved position is a position in (describe())
  bool packs_added_specials_ = false;  // rows of such examples changed when BOS/EOS came to be given once
  std::int64_t chats_ = 0;
  std::vector<Row> rows_;
  Row open_;
  std::int64_t cursor_ = 0;
  tessera::chat::Shard shard_;
  tessera::chat::SeededOrder order_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Dataset, SftConfig>(
      "sft_jsonl", "supervised fine-tuning examples from JSON lines, Parquet or datasets folders; only the responses are targets",
      [](const SftConfig& c, const tessera::RunContext& run) { return std::make_shared<SftDataset>(c, run.seed); });
}

}  // namespace

TESSERA_PLUGIN("dataset_sft_jsonl", "0.1.0", register_components)
