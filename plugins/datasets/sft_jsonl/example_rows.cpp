// The rows of a dataset of examples (example_rows.hpp).
#include "example_rows.hpp"

#include <filesystem>
#include <fstream>

#include "tessera/error.hpp"
#include "tessera/formats/arrow_tables.hpp"

namespace tessera::chat {
namespace {

void json_lines(const std::string& file, const RowTaker& take) {
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read " + file, "path");
  std::size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file + ":" + std::to_string(number);
    const nlohmann::ordered_json row = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) throw ConfigError(where + ": not a JSON object", "path");
    take(row, where);
  }
}

}  // namespace

void for_each_row(const ExampleFilesConfig& config, const std::vector<std::string>& columns, const RowTaker& take) {
  std::vector<std::string> files;
  try {
    files = table_files(config.path);
  } catch (const ConfigError& e) {
    throw ConfigError(e.what(), "path");
  }
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(config.path, ec);
  const RowSink table_row = [&](const std::string& text, const std::string& where) {
    take(nlohmann::ordered_json::parse(text), where);
  };
  for (const auto& file : files) {
    if (!std::filesystem::exists(file, ec)) throw ConfigError(file + ": no such file", "path");
    const TableFormat by_extension = table_format_of(file);
    const std::string& format = config.format;
    try {
      if (format == "parquet" || (format == "auto" && by_extension == TableFormat::parquet)) {
        read_parquet_rows(file, columns, table_row);
      } else if (format == "arrow" || folder || (format == "auto" && by_extension == TableFormat::arrow)) {
        read_arrow_rows(file, columns, table_row);
      } else {
        json_lines(file, take);
      }
    } catch (const ConfigError& e) {
      if (e.field() == "path") throw;
      throw ConfigError(e.what(), "path");
    }
  }
}

}  // namespace tessera::chat
