// Documents for `tessera prepare-data` from Parquet and Arrow IPC files (tessera/formats/
// arrow_tables.hpp): one text column read a record batch at a time. Part of the Arrow reader
// module (arrow_reader_module.hpp), compiled as C++20, which Arrow's headers need.
#include <memory>
#include <sstream>

#include "arrow_module_support.hpp"
#include "arrow_reader_module.hpp"

namespace tessera::arrow_module {
namespace {

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
// count as nulls of the field), the column validated in full first.
std::shared_ptr<arrow::Array> column_at(const arrow::RecordBatch& batch, const std::vector<std::string>& path,
                                        const std::string& where) {
  std::shared_ptr<arrow::Array> array = batch.GetColumnByName(path[0]);
  if (!array) throw ConfigError(where + ": no column '" + path[0] + "' in this batch", "");
  validate(*array, where);
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

}  // namespace

void parquet_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  const std::vector<std::string> parts = split_path(field);
  const std::unique_ptr<parquet::arrow::FileReader> reader = open_parquet(path);
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
  for (int group = 0; group < reader->num_row_groups(); ++group) {
    const std::string where = path + ": row group " + std::to_string(group);
    std::int64_t row = 0;  // rows numbered within the row group
    for_each_parquet_batch(*reader, group, {node->column_index}, where, [&](const arrow::RecordBatch& batch) {
      take_rows(*column_at(batch, parts, where), where, row, take);
      row += batch.num_rows();
    });
  }
}

void arrow_ipc_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  const std::vector<std::string> parts = split_path(field);
  for_each_ipc_batch(
      path, [&](const arrow::Schema& schema) { find_field(path, schema.fields(), parts, field); },
      [&](const arrow::RecordBatch& batch, std::int64_t index) {
        const std::string where = path + ": record batch " + std::to_string(index);
        find_field(path, batch.schema()->fields(), parts, field);
        take_rows(*column_at(batch, parts, where), where, 0, take);
      });
}

}  // namespace tessera::arrow_module
