// Reading a byte-level BPE tokenizer's files: Hugging Face's tokenizer.json (model BPE, the
// added tokens, a ByteLevel pre-tokenizer alone as GPT-2 has it or after a regex Split as
// Llama 3 has it), or GPT-2's vocab.json + merges.txt. What this reader does not understand (a
// normalizer, byte fallback, a Unigram model) is refused by name rather than encoded differently.
#pragma once

#include <string>

#include "bpe_model.hpp"

namespace tessera::bpe {

// Throws tessera::Error naming the file and the JSON path of what is wrong.
BpeDefinition read_tokenizer_json(const std::string& path);
// GPT-2's files; `special_tokens` are recognised in text as whole tokens (e.g. <|endoftext|>).
BpeDefinition read_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path,
                                    const std::vector<std::string>& special_tokens);

}  // namespace tessera::bpe
