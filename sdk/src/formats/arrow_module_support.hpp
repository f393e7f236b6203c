// What the Arrow reader module's readers share (arrow_documents.cpp: texts for prepare-data;
// arrow_rows.cpp: rows for datasets): opening files, the library's errors as one line, a column
// validated before it is read, record batches of a Parquet row group or an Arrow IPC file.
// Included only by the module's C++20 units (it includes Arrow's headers).
#pragma once

#include <arrow/array.h>
#include <arrow/io/file.h>
#include <arrow/record_batch.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "tessera/error.hpp"

namespace tessera::arrow_module {

// Rows per record batch read: a batch is what memory holds at a time.
inline constexpr std::int64_t kBatchRows = 1024;

// Runs `read`, turning the library's errors into one line about `where`; Tessera's own errors
// (a sink's: bad UTF-8, a tokenizer's) pass unchanged.
template <typename Read>
void reporting(const std::string& where, const Read& read) {
  try {
    read();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(where + ": unreadable, the file is truncated or corrupt (" + e.what() + ")", "");
  }
}

void check(const arrow::Status& status, const std::string& where);

// The array checked in full (offsets, UTF-8, dictionary indices): a corrupt file's offsets could
// otherwise point outside its data (the readers check the layout, not every offset).
void validate(const arrow::Array& array, const std::string& where);

// The Parquet file's reader, pages read through a bounded buffer (not a column chunk at a time),
// batches of kBatchRows.
std::unique_ptr<parquet::arrow::FileReader> open_parquet(const std::string& path);

// The record batches of `leaves` (Parquet leaf columns) in row group `group`, in order.
void for_each_parquet_batch(parquet::arrow::FileReader& reader, int group, const std::vector<int>& leaves,
                            const std::string& where, const std::function<void(const arrow::RecordBatch&)>& take);

// The record batches of an Arrow IPC file, stream or file format, with their index; `schema` is
// given the file's schema first (so a file without batches is checked too).
void for_each_ipc_batch(const std::string& path, const std::function<void(const arrow::Schema&)>& schema,
                        const std::function<void(const arrow::RecordBatch&, std::int64_t index)>& take);

}  // namespace tessera::arrow_module
