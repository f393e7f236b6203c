// tokenizer/bytes: the byte-level tokenizer (token id = byte value, 256 ids) that the
// quickstart's token files use (tools/data/text_to_tokens.py writes the same ids).
#include "tessera/components/tokenizer.hpp"
#include "tessera/plugin.hpp"

namespace {

class ByteTokenizer : public tessera::Tokenizer {
 public:
  std::vector<std::int64_t> encode(const std::string& text) const override {
    std::vector<std::int64_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  // Ids outside 0..255 (a model with a larger vocabulary can sample them) show as <id>.
  std::string decode(const std::vector<std::int64_t>& ids) const override {
    std::string text;
    for (std::int64_t id : ids) {
      if (id >= 0 && id < 256) {
        text += static_cast<char>(id);
      } else {
        text += "<" + std::to_string(id) + ">";
      }
    }
    return text;
  }
  std::int64_t vocab_size() const override { return 256; }
  std::string identity() const override { return "bytes"; }
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Tokenizer, tessera::NoConfig>(
      "bytes", "byte-level tokenizer: token id = byte value (256 ids)",
      [](const tessera::NoConfig&) { return std::make_shared<ByteTokenizer>(); });
}

}  // namespace

TESSERA_PLUGIN("tokenizer_bytes", "0.1.0", register_components)
