// Parquet and Arrow IPC reading (tessera/formats/arrow_tables.hpp, over the pyarrow wheel's Arrow
// C++): the input as a Parquet file and as an Arrow IPC file, its text column and a nested one
// taken as prepare-data takes documents, and its rows as the fine-tuning datasets take them (every
// column, and the chat columns). Refusals must be tessera::Error (one line naming the file).
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "tessera/formats/arrow_tables.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  std::size_t characters = 0;
  const DocumentSink take = [&](std::string text, const std::string&) { characters += text.size(); };
  const RowSink take_row = [&](const std::string& row, const std::string&) { characters += row.size(); };
  const std::string parquet = fuzz::write_file("input.parquet", data, size);
  for (const char* field : {"text", "meta.text"}) {
    fuzz::expect_clean([&] { read_parquet_documents(parquet, field, take); });
    fuzz::expect_clean([&] { read_arrow_documents(parquet, field, take); });
  }
  for (const std::vector<std::string>& columns : {std::vector<std::string>{}, std::vector<std::string>{"messages", "text"}}) {
    fuzz::expect_clean([&] { read_parquet_rows(parquet, columns, take_row); });
    fuzz::expect_clean([&] { read_arrow_rows(parquet, columns, take_row); });
  }
  return 0;
}
