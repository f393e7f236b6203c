// Byte-level BPE, the algorithm of GPT-2 and of Llama 3's tokenizer.json: text is cut at the
// added (special) tokens, each stretch is pre-tokenised by regular expressions, each piece's
// bytes are mapped to GPT-2's printable stand-ins and merged pair by pair in merge-rank order.
// The result equals Hugging Face's `tokenizers` for the same files (tests/integration).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "regex_splitter.hpp"

namespace tessera::bpe {

struct AddedToken {
  std::string content;
  std::int64_t id = 0;
  bool special = false;
};

// Everything a byte-level BPE tokenizer is made of, as read from its files (tokenizer_files.cpp).
struct BpeDefinition {
  std::unordered_map<std::string, std::int64_t> vocab;  // token (byte-level stand-ins) -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added;
  // Split patterns applied in turn (each piece of one is split by the next); empty: the whole
  // stretch is one piece.
  std::vector<std::string> split_patterns;
  bool add_prefix_space = false;  // a space before text that does not start with one
  bool ignore_merges = false;     // a piece that is a whole vocabulary token is that token
  std::string source;             // the file(s), for messages
};

class BpeModel {
 public:
  // Throws tessera::Error naming `definition.source` for a merge of unknown tokens and the like.
  explicit BpeModel(BpeDefinition definition);

  // Text (valid UTF-8, else tessera::Error) to ids. Added tokens are recognised anywhere.
  std::vector<std::int64_t> encode(std::string_view text) const;
  // Ids to text; added tokens are written as their content, unknown ids as <id>.
  std::string decode(const std::vector<std::int64_t>& ids) const;

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(id_to_token_.size()); }
  // The id of a token (an added one's content, or a vocabulary entry); -1 when there is none.
  std::int64_t token_id(const std::string& token) const;
  const std::vector<AddedToken>& added() const { return definition_.added; }

 private:
  void encode_stretch(std::string_view text, std::vector<std::int64_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<std::int64_t>& out) const;

  BpeDefinition definition_;
  std::vector<std::unique_ptr<RegexSplitter>> splitters_;
  std::vector<std::string> id_to_token_;        // byte-level stand-ins (or an added token's content)
  std::vector<bool> is_added_;                  // by id
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;  // (a, b) -> (rank, merged)
  std::int32_t byte_ids_[256];                  // the id of each byte's stand-in, -1 if absent
  std::uint64_t instance_;                      // keys this model's per-thread cache
};

// GPT-2's map of the 256 byte values to printable characters (UTF-8), and back.
const std::string& byte_stand_in(unsigned char byte);
// The bytes a token's stand-in characters stand for; false if a character is not a stand-in.
bool stand_ins_to_bytes(std::string_view token, std::string& bytes);

}  // namespace tessera::bpe
