// tokenizer/sentencepiece: a SentencePiece .model (Llama 2, T5, ...) through the SentencePiece
// library itself (Debian's libsentencepiece), so the ids are the library's.
#include <sentencepiece_processor.h>

#include <dlfcn.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/error.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/plugin.hpp"

namespace {

struct SentencePieceConfig {
  std::string path;
  bool add_bos = false;
  bool add_eos = false;

  static void declare(tessera::ConfigFields<SentencePieceConfig>& f) {
    f.field("path", &SentencePieceConfig::path, "the SentencePiece model file (tokenizer.model)").required().existing_path();
    f.field("add_bos", &SentencePieceConfig::add_bos, "encode() starts every text with the model's BOS id");
    f.field("add_eos", &SentencePieceConfig::add_eos, "encode() ends every text with the model's EOS id");
  }
};

class SentencePieceTokenizer final : public tessera::Tokenizer {
 public:
  explicit SentencePieceTokenizer(const SentencePieceConfig& c) : config_(c) {
    const auto status = processor_.Load(c.path);
    if (!status.ok()) {
      throw tessera::ConfigError(c.path + ": not a SentencePiece model (" + status.ToString() + ")", "path");
    }
    if (c.add_bos && processor_.bos_id() < 0) throw tessera::ConfigError(c.path + " has no BOS piece", "add_bos");
    if (c.add_eos && processor_.eos_id() < 0) throw tessera::ConfigError(c.path + " has no EOS piece", "add_eos");
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", tessera::file_crc32c(c.path));
    identity_ = std::string("sentencepiece ") + crc;
  }

  std::vector<std::int64_t> encode(const std::string& text) const override {
    std::vector<int> pieces;
    const auto status = processor_.Encode(text, &pieces);
    if (!status.ok()) throw tessera::Error("tokenizer/sentencepiece: " + status.ToString());
    std::vector<std::int64_t> ids;
    ids.reserve(pieces.size() + 2);
    if (config_.add_bos) ids.push_back(processor_.bos_id());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    if (config_.add_eos) ids.push_back(processor_.eos_id());
    return ids;
  }

  std::string decode(const std::vector<std::int64_t>& ids) const override {
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (std::int64_t id : ids) {
      if (id < 0 || id >= vocab_size()) throw tessera::Error("tokenizer/sentencepiece: id " + std::to_string(id) + " is outside the vocabulary");
      pieces.push_back(static_cast<int>(id));
    }
    std::string text;
    const auto status = processor_.Decode(pieces, &text);
    if (!status.ok()) throw tessera::Error("tokenizer/sentencepiece: " + status.ToString());
    return text;
  }

  std::int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::int64_t token_id(const std::string& token) const override {
    const int id = processor_.PieceToId(token);
    // PieceToId answers unk for anything it does not know; only the unk piece itself is unk.
    return id == processor_.unk_id() && token != processor_.IdToPiece(id) ? -1 : id;
  }
  std::int64_t eos_id() const override { return processor_.eos_id(); }
  std::int64_t bos_id() const override { return processor_.bos_id(); }
  std::string identity() const override { return identity_; }
  // Where tokenizer_config.json (and a chat template) sit beside tokenizer.model.
  std::string folder() const override { return std::filesystem::path(config_.path).parent_path().string(); }

 private:
  SentencePieceConfig config_;
  sentencepiece::SentencePieceProcessor processor_;
  std::string identity_;
};

// libsentencepiece carries protobuf, whose generated code registers its message types in
// process-wide tables when the library loads and keeps what it allocated there for the life of
// the process. Unloaded with this plugin (a plugin host destroyed), those allocations become
// unreachable (LeakSanitizer reports them) and a later load registers the same types again. So
// once this plugin has been loaded, the library stays: RTLD_NODELETE on the copy already loaded
// (its soname from Debian's libsentencepiece0; another build simply stays unpinned).
void keep_sentencepiece_loaded() {
  static void* const pinned = ::dlopen("libsentencepiece.so.0", RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  (void)pinned;
}

void register_components(tessera::Registrar& registrar) {
  keep_sentencepiece_loaded();
  registrar.add<tessera::Tokenizer, SentencePieceConfig>(
      "sentencepiece", "a SentencePiece model (.model) through the SentencePiece library",
      [](const SentencePieceConfig& c) { return std::make_shared<SentencePieceTokenizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("tokenizer_sentencepiece", "0.1.0", register_components)
