// Rows of Parquet and Arrow IPC files as JSON objects (tessera/formats/arrow_tables.hpp), for the
// datasets that read examples (dataset/sft_jsonl, dataset/preference_jsonl): chats as
// list<struct<role, content>>, prompt / response strings, whatever else a row holds. Values are
// what `datasets` hands Python, so a template sees the row as transformers would. Part of the
// Arrow reader module, compiled as C++20.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <arrow/scalar.h>

#include "arrow_module_support.hpp"
#include "arrow_reader_module.hpp"

namespace tessera::arrow_module {
namespace {

using Json = nlohmann::ordered_json;

template <typename ArrayType>
auto value_of(const arrow::Array& array, std::int64_t i) {
  return static_cast<const ArrayType&>(array).Value(i);
}

template <typename ListType>
Json list_at(const arrow::Array& array, std::int64_t i, const std::string& where);

// Value i of `array` as JSON. Every cast follows the array's own type id (a corrupt file's data
// need not match its schema); the arrays were validated in full before.
Json value_at(const arrow::Array& array, std::int64_t i, const std::string& where) {
  if (array.IsNull(i)) return nullptr;
  switch (array.type_id()) {
    case arrow::Type::BOOL: return value_of<arrow::BooleanArray>(array, i);
    case arrow::Type::INT8: return value_of<arrow::Int8Array>(array, i);
    case arrow::Type::INT16: return value_of<arrow::Int16Array>(array, i);
    case arrow::Type::INT32: return value_of<arrow::Int32Array>(array, i);
    case arrow::Type::INT64: return value_of<arrow::Int64Array>(array, i);
    case arrow::Type::UINT8: return value_of<arrow::UInt8Array>(array, i);
    case arrow::Type::UINT16: return value_of<arrow::UInt16Array>(array, i);
    case arrow::Type::UINT32: return value_of<arrow::UInt32Array>(array, i);
    case arrow::Type::UINT64: return value_of<arrow::UInt64Array>(array, i);
    case arrow::Type::FLOAT: return value_of<arrow::FloatArray>(array, i);
    case arrow::Type::DOUBLE: return value_of<arrow::DoubleArray>(array, i);
    case arrow::Type::STRING: return std::string(static_cast<const arrow::StringArray&>(array).GetView(i));
    case arrow::Type::LARGE_STRING: return std::string(static_cast<const arrow::LargeStringArray&>(array).GetView(i));
    case arrow::Type::STRING_VIEW: return std::string(static_cast<const arrow::StringViewArray&>(array).GetView(i));
    case arrow::Type::BINARY:
    case arrow::Type::LARGE_BINARY:
    case arrow::Type::BINARY_VIEW:
    case arrow::Type::FIXED_SIZE_BINARY:
      throw ConfigError(where + ": a value is bytes (" + array.type()->ToString() +
                            "), which an example's JSON cannot hold; leave the column out of the fields the dataset reads",
                        "");
    case arrow::Type::LIST: return list_at<arrow::ListArray>(array, i, where);
    case arrow::Type::LARGE_LIST: return list_at<arrow::LargeListArray>(array, i, where);
    case arrow::Type::MAP: return list_at<arrow::MapArray>(array, i, where);  // [[key, value], ...], as pyarrow gives
    case arrow::Type::FIXED_SIZE_LIST: {
      const auto& list = static_cast<const arrow::FixedSizeListArray&>(array);
      Json items = Json::array();
      for (std::int64_t j = list.value_offset(i), end = j + list.value_length(); j < end; ++j) {
        items.push_back(value_at(*list.values(), j, where));
      }
      return items;
    }
    case arrow::Type::STRUCT: {
      const auto& st = static_cast<const arrow::StructArray&>(array);
      Json object = Json::object();
      for (int k = 0; k < st.num_fields(); ++k) {
        object[st.struct_type()->field(k)->name()] = value_at(*st.field(k), i, where);  // field(k): sliced as st
      }
      return object;
    }
    case arrow::Type::DICTIONARY: {
      const auto& dict = static_cast<const arrow::DictionaryArray&>(array);
      const std::int64_t at = dict.GetValueIndex(i);
      if (at < 0 || at >= dict.dictionary()->length()) throw ConfigError(where + ": a dictionary index out of range", "");
      return value_at(*dict.dictionary(), at, where);
    }
    default: {
      // Dates, times, decimals, half floats: their text, as Arrow writes them.
      auto scalar = array.GetScalar(i);
      if (!scalar.ok()) throw ConfigError(where + ": " + scalar.status().ToString(), "");
      return (*scalar)->ToString();
    }
  }
}

template <typename ListType>
Json list_at(const arrow::Array& array, std::int64_t i, const std::string& where) {
  const auto& list = static_cast<const ListType&>(array);
  const arrow::Array& values = *list.values();
  Json items = Json::array();
  for (std::int64_t j = list.value_offset(i), end = list.value_offset(i + 1); j < end; ++j) {
    if constexpr (std::is_same_v<ListType, arrow::MapArray>) {
      // A map's values are struct<key, value>: each entry a pair.
      const Json entry = value_at(values, j, where);
      Json pair = Json::array();
      for (const auto& [name, v] : entry.items()) pair.push_back(v);
      items.push_back(std::move(pair));
    } else {
      items.push_back(value_at(values, j, where));
    }
  }
  return items;
}

bool wanted(const std::vector<std::string>& columns, const std::string& name) {
  return columns.empty() || std::find(columns.begin(), columns.end(), name) != columns.end();
}

// Refuses a file that has none of the columns asked for, naming those it has.
void check_columns(const std::string& path, const arrow::Schema& schema, const std::vector<std::string>& columns) {
  for (const auto& f : schema.fields()) {
    if (wanted(columns, f->name())) return;
  }
  std::string asked, has;
  for (const auto& c : columns) asked += (asked.empty() ? "" : ", ") + c;
  for (const auto& f : schema.fields()) has += (has.empty() ? "" : ", ") + f->name();
  throw ConfigError(path + ": none of the columns " + asked + " (it has " + (has.empty() ? "none" : has) +
                        "; name the dataset's fields after its columns)",
                    "");
}

// Each row of the batch's wanted columns to `take`, rows numbered from `first_row`.
void take_rows(const arrow::RecordBatch& batch, const std::vector<std::string>& columns, const std::string& where_prefix,
               std::int64_t first_row, const RowSink& take) {
  std::vector<std::pair<std::string, std::shared_ptr<arrow::Array>>> kept;
  for (int c = 0; c < batch.num_columns(); ++c) {
    const std::string& name = batch.schema()->field(c)->name();
    if (!wanted(columns, name)) continue;
    const std::shared_ptr<arrow::Array> column = batch.column(c);
    validate(*column, where_prefix + ", column '" + name + "'");
    kept.emplace_back(name, column);
  }
  for (std::int64_t row = 0; row < batch.num_rows(); ++row) {
    const std::string where = where_prefix + ", row " + std::to_string(first_row + row);
    Json object = Json::object();
    for (const auto& [name, column] : kept) object[name] = value_at(*column, row, where);
    std::string text;
    try {
      text = object.dump();
    } catch (const nlohmann::json::exception& e) {  // the arrays were validated: not expected
      throw ConfigError(where + ": " + e.what(), "");
    }
    take(text, where);
  }
}

// The leaf columns under a Parquet schema field.
void leaves_of(const parquet::arrow::SchemaField& field, std::vector<int>& leaves) {
  if (field.is_leaf()) leaves.push_back(field.column_index);
  for (const auto& child : field.children) leaves_of(child, leaves);
}

}  // namespace

void parquet_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take) {
  const std::unique_ptr<parquet::arrow::FileReader> reader = open_parquet(path);
  std::shared_ptr<arrow::Schema> schema;
  check(reader->GetSchema(&schema), path);
  check_columns(path, *schema, columns);
  std::vector<int> leaves;
  for (const auto& top : reader->manifest().schema_fields) {
    if (wanted(columns, top.field->name())) leaves_of(top, leaves);
  }
  for (int group = 0; group < reader->num_row_groups(); ++group) {
    const std::string where = path + ": row group " + std::to_string(group);
    std::int64_t row = 0;  // rows numbered within the row group
    for_each_parquet_batch(*reader, group, leaves, where, [&](const arrow::RecordBatch& batch) {
      take_rows(batch, columns, where, row, take);
      row += batch.num_rows();
    });
  }
}

void arrow_ipc_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take) {
  for_each_ipc_batch(
      path, [&](const arrow::Schema& schema) { check_columns(path, schema, columns); },
      [&](const arrow::RecordBatch& batch, std::int64_t index) {
        take_rows(batch, columns, path + ": record batch " + std::to_string(index), 0, take);
      });
}

}  // namespace tessera::arrow_module
