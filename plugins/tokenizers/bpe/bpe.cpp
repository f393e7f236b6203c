// tokenizer/bpe: byte-level BPE from Hugging Face's tokenizer.json (GPT-2, Llama 3 and the like)
// or GPT-2's vocab.json + merges.txt, giving exactly the ids of Python's `tokenizers`.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bpe_model.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/error.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/plugin.hpp"
#include "tokenizer_files.hpp"

namespace {

namespace fs = std::filesystem;

struct BpeConfig {
  std::string path;
  std::string merges;
  std::vector<std::string> special_tokens{"<|endoftext|>"};
  std::string eos_token;
  std::string bos_token;

  static void declare(tessera::ConfigFields<BpeConfig>& f) {
    f.field("path", &BpeConfig::path,
            "tokenizer.json (or a folder holding one), or GPT-2's vocab.json with `merges`")
        .required()
        .existing_path();
    f.field("merges", &BpeConfig::merges, "GPT-2's merges.txt, when path is a vocab.json").existing_path();
    f.field("special_tokens", &BpeConfig::special_tokens,
            "with vocab.json + merges.txt: vocabulary tokens recognised whole in text (tokenizer.json lists its own)");
    f.field("eos_token", &BpeConfig::eos_token,
            "the end-of-document token (empty: the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> it has)");
    f.field("bos_token", &BpeConfig::bos_token,
            "the beginning-of-document token (empty: the first of <|begin_of_text|>, <s>, <bos> it has)");
  }
};

std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

class BpeTokenizer final : public tessera::Tokenizer {
 public:
  explicit BpeTokenizer(const BpeConfig& c) : model_(load(c)), folder_(folder_of(c.path)) {
    eos_ = pick(c.eos_token, {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}, "eos_token");
    bos_ = pick(c.bos_token, {"<|begin_of_text|>", "<s>", "<bos>"}, "bos_token");
  }

  std::vector<std::int64_t> encode(const std::string& text) const override { return model_.encode(text); }
  std::string decode(const std::vector<std::int64_t>& ids) const override { return model_.decode(ids); }
  std::int64_t vocab_size() const override { return model_.vocab_size(); }
  std::int64_t token_id(const std::string& token) const override { return model_.token_id(token); }
  std::int64_t eos_id() const override { return eos_; }
  std::int64_t bos_id() const override { return bos_; }
  std::string identity() const override { return identity_; }
  std::string folder() const override { return folder_; }

 private:
  static std::string folder_of(const std::string& path) {
    const fs::path p(path);
    return fs::is_directory(p) ? p.string() : p.parent_path().string();
  }

  tessera::bpe::BpeModel load(const BpeConfig& c) {
    fs::path path(c.path);
    if (fs::is_directory(path)) path /= "tokenizer.json";
    try {
      if (!c.merges.empty()) {
        identity_ = "bpe " + path.filename().string() + ":" + hex(tessera::file_crc32c(path.string())) + " " +
                    fs::path(c.merges).filename().string() + ":" + hex(tessera::file_crc32c(c.merges));
        return tessera::bpe::BpeModel(tessera::bpe::read_vocab_and_merges(path.string(), c.merges, c.special_tokens));
      }
      if (path.filename() == "vocab.json") {
        throw tessera::ConfigError(path.string() + " is GPT-2's vocab.json: name its merges.txt in `merges`", "merges");
      }
      identity_ = "bpe " + path.filename().string() + ":" + hex(tessera::file_crc32c(path.string()));
      return tessera::bpe::BpeModel(tessera::bpe::read_tokenizer_json(path.string()));
    } catch (const tessera::ConfigError&) {
      throw;
    } catch (const tessera::Error& e) {
      throw tessera::ConfigError(e.what(), "path");
    }
  }

  std::int64_t pick(const std::string& configured, const std::vector<std::string>& known, const char* field) const {
    if (!configured.empty()) {
      const std::int64_t id = model_.token_id(configured);
      if (id < 0) throw tessera::ConfigError("the tokenizer has no token " + configured, field);
      return id;
    }
    for (const auto& name : known) {
      if (const std::int64_t id = model_.token_id(name); id >= 0) return id;
    }
    return -1;
  }

  std::string identity_;
  tessera::bpe::BpeModel model_;
  std::string folder_;
  std::int64_t eos_ = -1, bos_ = -1;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Tokenizer, BpeConfig>(
      "bpe", "byte-level BPE from a Hugging Face tokenizer.json or GPT-2's vocab.json + merges.txt",
      [](const BpeConfig& c) { return std::make_shared<BpeTokenizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("tokenizer_bpe", "0.1.0", register_components)
