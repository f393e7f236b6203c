#include "bpe_model.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>

#include "tessera/error.hpp"

namespace tessera::bpe {
namespace {

std::string utf8(std::uint32_t code) {
  std::string out;
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
// U+0100 upwards in byte order.
struct StandIns {
  std::string of_byte[256];
  std::unordered_map<std::string, unsigned char> to_byte;
  StandIns() {
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      of_byte[b] = utf8(printable ? b : next++);
      to_byte[of_byte[b]] = static_cast<unsigned char>(b);
    }
  }
};

const StandIns& stand_ins() {
  static const StandIns table;
  return table;
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

std::atomic<std::uint64_t> next_instance{1};

// Pieces already encoded, per thread and model: natural text repeats its words.
struct PieceCache {
  std::uint64_t instance = 0;
  std::unordered_map<std::string, std::vector<std::int64_t>> ids;
};
constexpr std::size_t kCacheLimit = 1 << 18;

}  // namespace

// Ids a vocabulary may leave unused (reserved special tokens are usually listed, not skipped).
constexpr std::int64_t kMaxUnusedIds = 1 << 16;

const std::string& byte_stand_in(unsigned char byte) { return stand_ins().of_byte[byte]; }

bool stand_ins_to_bytes(std::string_view token, std::string& bytes) {
  const auto& table = stand_ins().to_byte;
  std::size_t i = 0;
  while (i < token.size()) {
    const auto lead = static_cast<unsigned char>(token[i]);
    const std::size_t length = lead < 0x80 ? 1 : (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : 4;
    auto it = table.find(std::string(token.substr(i, length)));
    if (it == table.end()) return false;
    bytes += static_cast<char>(it->second);
    i += length;
  }
  return true;
}

BpeModel::BpeModel(BpeDefinition definition) : definition_(std::move(definition)), instance_(next_instance++) {
  const std::string& source = definition_.source;
  std::int64_t size = 0;
  for (const auto& [token, id] : definition_.vocab) {
    if (id < 0) throw Error(source + ": token " + token + " has a negative id");
    size = std::max(size, id + 1);
  }
  for (const auto& added : definition_.added) {
    if (added.id < 0) throw Error(source + ": the added token " + added.content + " has a negative id");
    size = std::max(size, added.id + 1);
  }
  // Ids index a table, so they must be about as many as the tokens: real vocabularies are dense,
  // with at most a few thousand reserved ids between (found by fuzzing: one id of 333333347 in a
  // 300-token vocab.json asked for 10 GB).
  const auto tokens = static_cast<std::int64_t>(definition_.vocab.size() + definition_.added.size());
  if (size > tokens + kMaxUnusedIds) {
    throw Error(source + ": token ids reach " + std::to_string(size - 1) + " for " + std::to_string(tokens) +
                " tokens; ids must number the vocabulary (is the file damaged?)");
  }
  id_to_token_.assign(static_cast<std::size_t>(size), "");
  is_added_.assign(static_cast<std::size_t>(size), false);
  for (const auto& [token, id] : definition_.vocab) id_to_token_[static_cast<std::size_t>(id)] = token;
  for (const auto& added : definition_.added) {
    if (added.content.empty()) throw Error(source + ": an added token with id " + std::to_string(added.id) + " is empty");
    id_to_token_[static_cast<std::size_t>(added.id)] = added.content;
    is_added_[static_cast<std::size_t>(added.id)] = true;
  }
  // Longer added tokens first: where two start at the same place the longer one wins.
  std::stable_sort(definition_.added.begin(), definition_.added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (int b = 0; b < 256; ++b) {
    auto it = definition_.vocab.find(byte_stand_in(static_cast<unsigned char>(b)));
    byte_ids_[b] = it == definition_.vocab.end() ? -1 : static_cast<std::int32_t>(it->second);
  }
  for (std::size_t rank = 0; rank < definition_.merges.size(); ++rank) {
    const auto& [left, right] = definition_.merges[rank];
    auto a = definition_.vocab.find(left), b = definition_.vocab.find(right), merged = definition_.vocab.find(left + right);
    if (a == definition_.vocab.end() || b == definition_.vocab.end() || merged == definition_.vocab.end()) {
      throw Error(source + ": merge " + std::to_string(rank) + " (" + left + " " + right +
                  ") names a token that is not in the vocabulary");
    }
    // The first (lowest-rank) occurrence of a pair counts, as in the reference implementation.
    merges_.emplace(pair_key(static_cast<std::int32_t>(a->second), static_cast<std::int32_t>(b->second)),
                    std::make_pair(static_cast<std::int32_t>(rank), static_cast<std::int32_t>(merged->second)));
  }
  for (const auto& pattern : definition_.split_patterns) splitters_.push_back(std::make_unique<RegexSplitter>(pattern));
}

std::int64_t BpeModel::token_id(const std::string& token) const {
  for (const auto& added : definition_.added) {
    if (added.content == token) return added.id;
  }
  auto it = definition_.vocab.find(token);
  return it == definition_.vocab.end() ? -1 : it->second;
}

std::vector<std::int64_t> BpeModel::encode(std::string_view text) const {
  check_utf8(text);
  std::vector<std::int64_t> out;
  out.reserve(text.size() / 3 + 1);
  // Cut at the earliest added token (the longest where several start there).
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t best = std::string_view::npos;
    const AddedToken* found = nullptr;
    for (const auto& added : definition_.added) {
      const std::size_t at = text.find(added.content, pos);
      if (at < best) best = at, found = &added;
    }
    if (!found) break;
    if (best > pos) encode_stretch(text.substr(pos, best - pos), out);
    out.push_back(found->id);
    pos = best + found->content.size();
  }
  if (pos < text.size()) encode_stretch(text.substr(pos), out);
  return out;
}

void BpeModel::encode_stretch(std::string_view text, std::vector<std::int64_t>& out) const {
  std::string prefixed;
  if (definition_.add_prefix_space && !text.empty() && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  // Each splitter cuts the pieces of the one before.
  std::function<void(std::string_view, std::size_t)> split_from = [&](std::string_view piece, std::size_t level) {
    if (level == splitters_.size()) {
      encode_piece(piece, out);
      return;
    }
    splitters_[level]->split(piece, [&](std::string_view sub) { split_from(sub, level + 1); });
  };
  split_from(text, 0);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<std::int64_t>& out) const {
  if (piece.empty()) return;
  thread_local PieceCache cache;
  if (cache.instance != instance_) {
    cache.ids.clear();
    cache.instance = instance_;
  }
  const std::string key(piece);
  if (auto hit = cache.ids.find(key); hit != cache.ids.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<std::int64_t> ids;
  std::string mapped;
  for (unsigned char byte : piece) mapped += byte_stand_in(byte);
  auto whole = definition_.ignore_merges ? definition_.vocab.find(mapped) : definition_.vocab.end();
  if (whole != definition_.vocab.end()) {
    ids.push_back(whole->second);
  } else {
    std::vector<std::int32_t> symbols;
    symbols.reserve(piece.size());
    for (unsigned char byte : piece) {
      if (byte_ids_[byte] < 0) {
        throw Error(definition_.source + ": the vocabulary has no token for byte " + std::to_string(byte) +
                    " (not a byte-level BPE?)");
      }
      symbols.push_back(byte_ids_[byte]);
    }
    // Merge the lowest-ranked adjacent pair (the leftmost among equals) until none is left.
    while (symbols.size() > 1) {
      std::int32_t best_rank = std::numeric_limits<std::int32_t>::max(), merged = -1;
      std::size_t at = 0;
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
        if (it != merges_.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          merged = it->second.second;
          at = i;
        }
      }
      if (merged < 0) break;
      symbols[at] = merged;
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    ids.assign(symbols.begin(), symbols.end());
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache.ids.size() >= kCacheLimit) cache.ids.clear();
  cache.ids.emplace(key, std::move(ids));
}

std::string BpeModel::decode(const std::vector<std::int64_t>& ids) const {
  std::string text;
  for (std::int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || id_to_token_[static_cast<std::size_t>(id)].empty()) {
      text += "<" + std::to_string(id) + ">";
    } else {
      const std::string& token = id_to_token_[static_cast<std::size_t>(id)];
      std::string bytes;
      text += !is_added_[static_cast<std::size_t>(id)] && stand_ins_to_bytes(token, bytes) ? bytes : token;
    }
  }
  return text;
}

}  // namespace tessera::bpe
