// What the Arrow reader module's readers share (arrow_module_support.hpp).
#include "arrow_module_support.hpp"

#include <arrow/ipc/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/properties.h>

namespace tessera::arrow_module {
namespace {

std::shared_ptr<arrow::io::ReadableFile> open_file(const std::string& path) {
  auto opened = arrow::io::ReadableFile::Open(path);
  if (!opened.ok()) throw ConfigError(path + ": cannot open it (" + opened.status().message() + ")", "");
  return *opened;
}

}  // namespace

void check(const arrow::Status& status, const std::string& where) {
  if (!status.ok()) throw ConfigError(where + ": unreadable, the file is truncated or corrupt (" + status.message() + ")", "");
}

void validate(const arrow::Array& array, const std::string& where) {
  const arrow::Status valid = array.ValidateFull();
  if (valid.ok()) return;
  if (valid.message().find("UTF8") != std::string::npos || valid.message().find("UTF-8") != std::string::npos) {
    throw ConfigError(where + ": invalid UTF-8 in the text (" + valid.message() + ")", "");
  }
  throw ConfigError(where + ": unreadable, the file is truncated or corrupt (" + valid.message() + ")", "");
}

std::unique_ptr<parquet::arrow::FileReader> open_parquet(const std::string& path) {
  std::unique_ptr<parquet::arrow::FileReader> reader;
  reporting(path, [&] {
    parquet::ReaderProperties properties = parquet::default_reader_properties();
    properties.enable_buffered_stream();
    properties.set_buffer_size(1 << 20);
    std::unique_ptr<parquet::ParquetFileReader> file;
    try {
      file = parquet::ParquetFileReader::Open(open_file(path), properties);
    } catch (const parquet::ParquetException& e) {
      throw ConfigError(path + ": not a Parquet file, or truncated (" + std::string(e.what()) + ")", "");
    }
    parquet::ArrowReaderProperties arrow_properties;
    arrow_properties.set_batch_size(kBatchRows);
    arrow_properties.set_pre_buffer(false);
    auto made = parquet::arrow::FileReader::Make(arrow::default_memory_pool(), std::move(file), arrow_properties);
    check(made.status(), path);
    reader = std::move(*made);
  });
  return reader;
}

void for_each_parquet_batch(parquet::arrow::FileReader& reader, int group, const std::vector<int>& leaves,
                            const std::string& where, const std::function<void(const arrow::RecordBatch&)>& take) {
  std::unique_ptr<arrow::RecordBatchReader> batches;
  reporting(where, [&] {
    auto made = reader.GetRecordBatchReader({group}, leaves);
    check(made.status(), where);
    batches = std::move(*made);
  });
  for (;;) {
    std::shared_ptr<arrow::RecordBatch> batch;
    reporting(where, [&] { check(batches->ReadNext(&batch), where); });
    if (!batch) break;
    take(*batch);
  }
}

void for_each_ipc_batch(const std::string& path, const std::function<void(const arrow::Schema&)>& schema,
                        const std::function<void(const arrow::RecordBatch&, std::int64_t index)>& take) {
  auto file = open_file(path);
  // The file format begins with the magic ARROW1; `datasets` writes the stream format.
  std::uint8_t magic[6] = {0};
  bool file_format = false;
  {
    auto read = file->ReadAt(0, 6, magic);
    file_format = read.ok() && *read == 6 && std::string(reinterpret_cast<char*>(magic), 6) == "ARROW1";
    check(file->Seek(0), path);  // the stream reader reads on from the position
  }
  if (file_format) {
    std::shared_ptr<arrow::ipc::RecordBatchFileReader> reader;
    reporting(path, [&] {
      auto opened = arrow::ipc::RecordBatchFileReader::Open(file);
      check(opened.status(), path);
      reader = *opened;
    });
    schema(*reader->schema());
    for (int b = 0; b < reader->num_record_batches(); ++b) {
      std::shared_ptr<arrow::RecordBatch> batch;
      const std::string where = path + ": record batch " + std::to_string(b);
      reporting(where, [&] {
        auto read = reader->ReadRecordBatch(b);
        check(read.status(), where);
        batch = *read;
      });
      take(*batch, b);
    }
    return;
  }
  std::shared_ptr<arrow::ipc::RecordBatchStreamReader> reader;
  reporting(path, [&] {
    auto opened = arrow::ipc::RecordBatchStreamReader::Open(file);
    check(opened.status(), path + " (not an Arrow IPC file)");
    reader = *opened;
  });
  schema(*reader->schema());
  for (std::int64_t b = 0;; ++b) {
    std::shared_ptr<arrow::RecordBatch> batch;
    const std::string where = path + ": record batch " + std::to_string(b);
    reporting(where, [&] { check(reader->ReadNext(&batch), where); });
    if (!batch) break;
    take(*batch, b);
  }
}

}  // namespace tessera::arrow_module
