// tokenizer/bpe's reader of Hugging Face tokenizer.json (model, merges, added tokens,
// pre-tokenizer regexes compiled with PCRE2), then an encode and decode with what it accepted.
#include <cstdint>
#include <string>

#include "bpe_model.hpp"
#include "fuzz_support.hpp"
#include "tokenizer_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string path = fuzz::write_file("tokenizer.json", data, size);
  fuzz::expect_clean([&] {
    const bpe::BpeModel model(bpe::read_tokenizer_json(path));
    const auto ids = model.encode("Hello, world! 123 <|endoftext|> caf\xc3\xa9  \n\tend");
    (void)model.decode(ids);
  });
  return 0;
}
