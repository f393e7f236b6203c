// Parquet and Arrow IPC documents through Apache Arrow C++ (tessera/core/data/arrow_documents.hpp):
// the module lib/tessera/libtessera_arrow_reader.so, which the host loads on first use
// (arrow_documents_loader.cpp). Compiled as C++20, which Arrow's headers need; nothing from
// Arrow crosses the interface.
#include "tessera/core/data/arrow_documents.hpp"

#include <arrow/array.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <arrow/record_batch.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/properties.h>

#include <memory>
#include <sstream>

#include "tessera/error.hpp"

namespace tessera::core {
namespace {

// Rows per record batch read: a batch of one text column is what memory holds at a time.
constexpr std::int64_t kBatchRows = 1024;

std::vector<std::string> split_path(const std::string& field) {
  std::vector<std::string> parts;
  std::stringstream in(field);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  if (parts.empty()) parts.push_back(field);
  return parts;
}

bool is_text(const arrow::DataType& type) {
  switch (type.id()) {
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
      return true;
    case arrow::Type::DICTIONARY:
      return is_text(*static_cast<const arrow::DictionaryType&>(type).value_type());
    default:
      return false;
  }
}

std::string names_of(const arrow::FieldVector& fields) {
  std::string names;
  for (const auto& f : fields) names += (names.empty() ? "" : ", ") + f->name();
  return names;
}

// The field at `path` (nested through structs) of `fields`, or a ConfigError naming what exists.
std::shared_ptr<arrow::Field> find_field(const std::string& file, const arrow::FieldVector& fields,
                                         const std::vector<std::string>& path, const std::string& dotted) {
  const arrow::FieldVector* level = &fields;
  std::shared_ptr<arrow::Field> found;
  for (std::size_t i = 0; i < path.size(); ++i) {
    found.reset();
    for (const auto& f : *level) {
      if (f->name() == path[i]) found = f;
    }
    if (!found) {
      throw ConfigError(file + ": no column '" + dotted + "' (it has " + names_of(*level) +
                            "; choose the text column with --field, a nested one as a.b)",
                        "");
    }
    if (i + 1 < path.size()) {
      if (found->type()->id() != arrow::Type::STRUCT) {
        throw ConfigError(file + ": column '" + path[i] + "' is " + found->type()->ToString() + ", not a struct, so it has no '" +
                              path[i + 1] + "'",
                          "");
      }
      level = &found->type()->fields();
    }
  }
  if (!is_text(*found->type())) {
    throw ConfigError(file + ": column '" + dotted + "' is " + found->type()->ToString() +
                          ", not text (a string column); choose the text column with --field",
                      "");
  }
  return found;
}

// Each row's text of `column` to `take`, rows numbered from `first_row`; a null is an error at
// its row. The array's own type decides (a corrupt file's data need not match its schema), and
// every cast is to the class that type has.
void take_rows(const arrow::Array& column, const std::string& where_prefix, std::int64_t first_row,
               const DocumentSink& take) {
  const arrow::Array* values = &column;
  const arrow::DictionaryArray* dictionary = nullptr;
  if (column.type_id() == arrow::Type::DICTIONARY) {
    dictionary = &static_cast<const arrow::DictionaryArray&>(column);
    values = dictionary->dictionary().get();
  }
  const arrow::Type::type kind = values->type_id();
  if (kind != arrow::Type::STRING && kind != arrow::Type::LARGE_STRING && kind != arrow::Type::STRING_VIEW) {
    throw ConfigError(where_prefix + ": the column holds " + column.type()->ToString() + ", not text", "");
  }
  auto text_at = [&](std::int64_t i) -> std::string_view {
    switch (kind) {
      case arrow::Type::STRING:
        return static_cast<const arrow::StringArray&>(*values).GetView(i);
      case arrow::Type::LARGE_STRING:
        return static_cast<const arrow::LargeStringArray&>(*values).GetView(i);
      default:
        return static_cast<const arrow::StringViewArray&>(*values).GetView(i);
    }
  };
  for (std::int64_t row = 0; row < column.length(); ++row) {
    const std::string where = where_prefix + ", row " + std::to_string(first_row + row);
    if (column.IsNull(row)) throw ConfigError(where + ": the text is null", "");
    std::int64_t at = row;
    if (dictionary) {
      at = dictionary->GetValueIndex(row);  // any index type
      if (at < 0 || at >= values->length()) throw ConfigError(where + ": a dictionary index out of range", "");
      if (values->IsNull(at)) throw ConfigError(where + ": the text is null", "");
    }
    const std::string_view text = text_at(at);
    take(std::string(text), where);
  }
}

// The array at `path` inside a batch whose first column is path[0] (nulls of enclosing structs
// count as nulls of the field). The column is validated in full first: a corrupt file's offsets
// could otherwise point outside its data (the readers check the layout, not every offset).
std::shared_ptr<arrow::Array> column_at(const arrow::RecordBatch& batch, const std::vector<std::string>& path,
                                        const std::string& where) {
  std::shared_ptr<arrow::Array> array = batch.GetColumnByName(path[0]);
  if (!array) throw ConfigError(where + ": no column '" + path[0] + "' in this batch", "");
  if (const arrow::Status valid = array->ValidateFull(); !valid.ok()) {
    if (valid.message().find("UTF8") != std::string::npos || valid.message().find("UTF-8") != std::string::npos) {
      throw ConfigError(where + ": invalid UTF-8 in the text (" + valid.message() + ")", "");
    }
    throw ConfigError(where + ": unreadable, the file is truncated or corrupt (" + valid.message() + ")", "");
  }
  for (std::size_t i = 1; i < path.size(); ++i) {
    if (array->type_id() != arrow::Type::STRUCT) {
      throw ConfigError(where + ": '" + path[i - 1] + "' holds " + array->type()->ToString() + ", not a struct", "");
    }
    const auto& parent = static_cast<const arrow::StructArray&>(*array);
    const int child = parent.struct_type()->GetFieldIndex(path[i]);
    if (child < 0) throw ConfigError(where + ": no field '" + path[i] + "' in '" + path[i - 1] + "'", "");
    auto flattened = parent.GetFlattenedField(child);
    if (!flattened.ok()) throw ConfigError(where + ": " + flattened.status().ToString(), "");
    array = *flattened;
  }
  return array;
}

std::shared_ptr<arrow::io::ReadableFile> open_file(const std::string& path) {
  auto opened = arrow::io::ReadableFile::Open(path);
  if (!opened.ok()) throw ConfigError(path + ": cannot open it (" + opened.status().message() + ")", "");
  return *opened;
}

// Runs `read`, turning the library's errors into one line about `where`; Tessera's own errors
// (the sink's: bad UTF-8, a tokenizer's) pass unchanged.
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

void check(const arrow::Status& status, const std::string& where) {
  if (!status.ok()) throw ConfigError(where + ": unreadable, the file is truncated or corrupt (" + status.message() + ")", "");
}

void parquet_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  const std::vector<std::string> parts = split_path(field);
  std::unique_ptr<parquet::arrow::FileReader> reader;
  reporting(path, [&] {
    // Pages are read through a bounded buffer, not a column chunk at a time.
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
  std::shared_ptr<arrow::Schema> schema;
  check(reader->GetSchema(&schema), path);
  find_field(path, schema->fields(), parts, field);
  // The Parquet leaf columns under the field (one for a text column).
  const parquet::arrow::SchemaField* node = nullptr;
  for (const auto& top : reader->manifest().schema_fields) {
    if (top.field->name() == parts[0]) node = &top;
  }
  for (std::size_t i = 1; node && i < parts.size(); ++i) {
    const parquet::arrow::SchemaField* next = nullptr;
    for (const auto& child : node->children) {
      if (child.field->name() == parts[i]) next = &child;
    }
    node = next;
  }
  if (!node || !node->is_leaf()) throw ConfigError(path + ": column '" + field + "' is not a plain text column", "");
  const int leaf = node->column_index;
  for (int group = 0; group < reader->num_row_groups(); ++group) {
    const std::string where = path + ": row group " + std::to_string(group);
    std::unique_ptr<arrow::RecordBatchReader> batches;
    reporting(where, [&] {
      auto made = reader->GetRecordBatchReader({group}, {leaf});
      check(made.status(), where);
      batches = std::move(*made);
    });
    std::int64_t row = 0;
    for (;;) {
      std::shared_ptr<arrow::RecordBatch> batch;
      reporting(where, [&] { check(batches->ReadNext(&batch), where); });
      if (!batch) break;
      const std::shared_ptr<arrow::Array> column = column_at(*batch, parts, where);
      take_rows(*column, where, row, take);  // rows numbered within the row group
      row += batch->num_rows();
    }
  }
}

void arrow_ipc_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  const std::vector<std::string> parts = split_path(field);
  auto file = open_file(path);
  // The file format begins with the magic ARROW1; `datasets` writes the stream format.
  std::uint8_t magic[6] = {0};
  bool file_format = false;
  {
    auto read = file->ReadAt(0, 6, magic);
    file_format = read.ok() && *read == 6 && std::string(reinterpret_cast<char*>(magic), 6) == "ARROW1";
    check(file->Seek(0), path);  // the stream reader reads on from the position
  }
  auto each_batch = [&](const std::shared_ptr<arrow::RecordBatch>& batch, std::int64_t index) {
    const std::string where = path + ": record batch " + std::to_string(index);
    find_field(path, batch->schema()->fields(), parts, field);
    take_rows(*column_at(*batch, parts, where), where, 0, take);
  };
  if (file_format) {
    std::shared_ptr<arrow::ipc::RecordBatchFileReader> reader;
    reporting(path, [&] {
      auto opened = arrow::ipc::RecordBatchFileReader::Open(file);
      check(opened.status(), path);
      reader = *opened;
    });
    for (int b = 0; b < reader->num_record_batches(); ++b) {
      std::shared_ptr<arrow::RecordBatch> batch;
      const std::string where = path + ": record batch " + std::to_string(b);
      reporting(where, [&] {
        auto read = reader->ReadRecordBatch(b);
        check(read.status(), where);
        batch = *read;
      });
      each_batch(batch, b);
    }
    return;
  }
  std::shared_ptr<arrow::ipc::RecordBatchStreamReader> reader;
  reporting(path, [&] {
    auto opened = arrow::ipc::RecordBatchStreamReader::Open(file);
    check(opened.status(), path + " (not an Arrow IPC file)");
    reader = *opened;
  });
  find_field(path, reader->schema()->fields(), parts, field);
  for (std::int64_t b = 0;; ++b) {
    std::shared_ptr<arrow::RecordBatch> batch;
    const std::string where = path + ": record batch " + std::to_string(b);
    reporting(where, [&] { check(reader->ReadNext(&batch), where); });
    if (!batch) break;
    each_batch(batch, b);
  }
}

}  // namespace

}  // namespace tessera::core

extern "C" __attribute__((visibility("default"))) const tessera::core::ArrowReaders* tessera_arrow_readers() {
  static const tessera::core::ArrowReaders readers{&tessera::core::parquet_documents,
                                                   &tessera::core::arrow_ipc_documents};
  return &readers;
}
