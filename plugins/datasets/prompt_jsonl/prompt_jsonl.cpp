// Dataset `prompt_jsonl`: prompts for reinforcement learning (loss/grpo) from JSON lines
// {"prompt": TEXT | MESSAGES, ...} or the same columns of Parquet files, Arrow files or a
// `datasets` folder (example_rows.hpp). Messages are written with the model's chat template and
// its generation prompt (chat_encoding.hpp; without one, sft_jsonl's plain ROLE: CONTENT lines and
// "assistant: "), text as the tokenizer encodes it. Every other field of a row reaches the
// rewards. It gives prompts (tessera/components/prompt_source.hpp), not batches of tokens.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat_encoding.hpp"
#include "example_rows.hpp"
#include "seeded_order.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/components/prompt_source.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

using Json = nlohmann::ordered_json;

struct PromptConfig : tessera::chat::ChatFormatConfig, tessera::chat::ExampleFilesConfig {
  std::shared_ptr<tessera::Tokenizer> tokenizer;
  std::string prompt_field = "prompt";
  std::int64_t max_prompt_length = 0;
  bool shuffle = true;
  std::int64_t seed = -1;

  // A prompt of messages ends with the template's generation prompt: the model answers after it.
  PromptConfig() { add_generation_prompt = true; }

  static void declare(tessera::ConfigFields<PromptConfig>& f) {
    using C = PromptConfig;
    declare_file_fields(f, "JSON lines {prompt: text or messages, ...}: every other field reaches the rewards");
    f.field("tokenizer", &C::tokenizer, "the tokenizer of the model").required();
    f.field("prompt_field", &C::prompt_field, "the field holding the prompt (text, or messages so far)");
    f.field("max_prompt_length", &C::max_prompt_length,
            "keep a prompt's last this many tokens (0: the whole prompt); TRL 1.16's GRPOTrainer has no such limit")
        .at_least(0);
    f.field("shuffle", &C::shuffle, "a new seeded order of prompts every epoch");
    f.field("seed", &C::seed, "seed of the order; -1 = the run seed").at_least(-1);
    declare_chat_fields(f);
    f.check([](const C& c) {
      if (!c.add_generation_prompt) {
        throw tessera::ConfigError("a prompt ends with the template's generation prompt, which the model answers "
                                   "after; leave add_generation_prompt true", "add_generation_prompt");
      }
    });
  }
};

class PromptDataset final : public tessera::Dataset, public tessera::PromptSource {
 public:
  PromptDataset(const PromptConfig& c, std::uint64_t run_seed)
      : tokenizer_(c.tokenizer), shuffle_(c.shuffle), seed_(c.seed < 0 ? run_seed : static_cast<std::uint64_t>(c.seed)), order_(shuffle_, seed_) {
    const tessera::chat::ChatEncoder chat(*c.tokenizer, c);
    const tessera::Tokenizer& tok = *c.tokenizer;
    std::size_t cut = 0, chats = 0;
    tessera::chat::for_each_row(c, {}, [&](const Json& row, const std::string& where) {
      const auto prompt = row.find(c.prompt_field);
      if (prompt == row.end() || !(prompt->is_string() || prompt->is_array())) {
        throw tessera::ConfigError(where + ": no field '" + c.prompt_field + "' holding a text or messages", "path");
      }
      tessera::Prompt p;
      p.index = static_cast<std::int64_t>(prompts_.size());
      try {
        if (prompt->is_string()) {
          p.text = prompt->get<std::string>();
          p.ids = tok.encode(p.text);
        } else {
          const auto tools = row.find(c.tools_field);
          const Json* row_tools = tools == row.end() || tools->is_null() ? nullptr : &*tools;
          if (chat.templated()) {
            p.ids = chat.render_ids(*prompt, row_tools, /*add_generation_prompt=*/true, &p.text);
          } else {
            p.ids = chat.encode(*prompt, row_tools).tokens;
            const auto turn = chat.plain_ids("assistant: ");
            p.ids.insert(p.ids.end(), turn.begin(), turn.end());
            p.text = tok.decode(p.ids);
          }
          ++chats;
        }
      } catch (const tessera::ConfigError&) {
        throw;
      } catch (const std::exception& e) {
        throw tessera::ConfigError(where + ": " + e.what(), "path");
      }
      if (p.ids.empty()) throw tessera::ConfigError(where + ": the prompt has no tokens", "path");
      if (c.max_prompt_length > 0 && static_cast<std::int64_t>(p.ids.size()) > c.max_prompt_length) {
        // The prompt's end: the question nearest the answer.
        p.ids.erase(p.ids.begin(), p.ids.end() - c.max_prompt_length);
        p.text = tok.decode(p.ids);
        ++cut;
      }
      for (const auto& [key, value] : row.items()) {
        if (key != c.prompt_field) p.row[key] = value;
      }
      longest_ = std::max(longest_, static_cast<std::int64_t>(p.ids.size()));
      prompts_.push_back(std::move(p));
    });
    if (prompts_.empty()) throw tessera::ConfigError(c.path + " holds no prompts", "path");
    if (cut > 0) {
      tessera::log::info("dataset/prompt_jsonl: ", cut, " of ", prompts_.size(), " prompts of ", c.path,
                         " cut to their last ", c.max_prompt_length, " tokens");
    }
    if (chats > 0) {
      tessera::log::info("dataset/prompt_jsonl: ", chats, " prompts of messages of ", c.path, " written with ",
                         chat.describe());
    }
    std::uint32_t crc = 0;
    for (const auto& p : prompts_) crc = tessera::crc32c(p.ids.data(), p.ids.size() * sizeof(std::int64_t), crc);
    layout_ = {num_samples(), shuffle_ ? 1 : 0, shuffle_ ? static_cast<std::int64_t>(seed_) : 0,
               static_cast<std::int64_t>(crc)};
  }

  tessera::PromptSource* prompts() override { return this; }

  std::vector<tessera::Prompt> next_prompts(std::int64_t count) override {
    std::vector<tessera::Prompt> out;
    for (std::int64_t i = 0; i < count; ++i) {
      out.push_back(prompts_[order_.at(cursor_ + shard_.rank, num_samples())]);
      cursor_ += shard_.world;
    }
    return out;
  }

  std::string decode(const std::vector<std::int64_t>& ids) const override { return tokenizer_->decode(ids); }
  std::vector<std::int64_t> eos_token_ids() const override {
    if (tokenizer_->eos_id() < 0) return {};
    return {tokenizer_->eos_id()};
  }

  void set_shard(std::int64_t rank, std::int64_t world_size) override {
    shard_.set(rank, world_size, "dataset/prompt_jsonl");
  }

  tessera::Batch next_batch(std::int64_t) override {
    throw tessera::Error("dataset/prompt_jsonl holds prompts, which loss/grpo completes and scores, not token "
                         "sequences to train on; for supervised fine-tuning use dataset/sft_jsonl");
  }
  // The longest prompt's tokens.
  std::int64_t seq_len() const override { return longest_; }
  std::int64_t num_samples() const override { return static_cast<std::int64_t>(prompts_.size()); }

  tessera::StateDict state_dict() const override {
    return tessera::chat::position_state(cursor_, num_samples(), layout_);
  }
  void load_state_dict(const tessera::StateDict& state) override {
    cursor_ = tessera::chat::position_from_state(state, num_samples(), layout_, "dataset/prompt_jsonl", "prompts",
                                                 "another file, tokenizer, template, max_prompt_length or order");
  }

 private:
  std::shared_ptr<tessera::Tokenizer> tokenizer_;
  std::vector<tessera::Prompt> prompts_;
  std::int64_t longest_ = 0;
  bool shuffle_;
  std::uint64_t seed_;
  tessera::chat::SeededOrder order_;
  tessera::chat::Shard shard_;
  std::int64_t cursor_ = 0;  // global position: this rank reads cursor_ + rank, then steps by world
  std::vector<std::int64_t> layout_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Dataset, PromptConfig>(
      "prompt_jsonl", "prompts (text, or messages with the chat template's generation prompt) and their rows, for "
                      "reinforcement learning (loss/grpo)",
      [](const PromptConfig& c, const tessera::RunContext& run) { return std::make_shared<PromptDataset>(c, run.seed); });
}

}  // namespace

TESSERA_PLUGIN("dataset_prompt_jsonl", "0.1.0", register_components)
