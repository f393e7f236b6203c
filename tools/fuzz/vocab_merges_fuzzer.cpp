// tokenizer/bpe's reader of GPT-2's vocab.json + merges.txt: the input is both files, the
// vocabulary before the first line "#merges" and the merges after it, then an encode and decode.
#include <cstdint>
#include <string>

#include "bpe_model.hpp"
#include "fuzz_support.hpp"
#include "tokenizer_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto cut = input.find("\n#merges\n");
  const std::string vocab = input.substr(0, cut);
  const std::string merges = cut == std::string::npos ? std::string() : input.substr(cut + 9);
  const std::string vocab_path =
      fuzz::write_file("vocab.json", reinterpret_cast<const std::uint8_t*>(vocab.data()), vocab.size());
  const std::string merges_path =
      fuzz::write_file("merges.txt", reinterpret_cast<const std::uint8_t*>(merges.data()), merges.size());
  fuzz::expect_clean([&] {
    const bpe::BpeModel model(bpe::read_vocab_and_merges(vocab_path, merges_path, {"<|endoftext|>"}));
    const auto ids = model.encode("Hello, world! 123 <|endoftext|> caf\xc3\xa9  \n\tend");
    (void)model.decode(ids);
  });
  return 0;
}
