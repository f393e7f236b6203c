// `tessera prepare-data`'s Parquet and Arrow IPC reading (core/src/data/arrow_documents.cpp, over
// the pyarrow wheel's Arrow C++): the input as a Parquet file and as an Arrow IPC file, its text
// column and a nested one taken. Refusals must be tessera::Error (one line naming the file).
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "tessera/core/data/arrow_documents.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  std::size_t characters = 0;
  const core::DocumentSink take = [&](std::string text, const std::string&) { characters += text.size(); };
  const std::string parquet = fuzz::write_file("input.parquet", data, size);
  for (const char* field : {"text", "meta.text"}) {
    fuzz::expect_clean([&] { core::read_parquet_documents(parquet, field, take); });
    fuzz::expect_clean([&] { core::read_arrow_documents(parquet, field, take); });
  }
  return 0;
}
