// The rows of a dataset of examples, each a JSON object with where it came from: JSON lines (an
// object a line), or Parquet files, Arrow IPC files and Hugging Face `datasets` folders through
// the SDK's Arrow reader (tessera/formats/arrow_tables.hpp), a quoted glob of them in name order.
// Shared by dataset/sft_jsonl and dataset/preference_jsonl.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"

namespace tessera::chat {

// The config fields saying where the rows are; a dataset's config derives from it.
struct ExampleFilesConfig {
  std::string path;
  std::string format = "auto";

  template <class Config>
  static void declare_file_fields(ConfigFields<Config>& f, const std::string& path_help) {
    f.field("path", &ExampleFilesConfig::path,
            path_help + "; or Parquet files, Arrow IPC files or a `datasets` save_to_disk folder with those columns (a "
                        "quoted glob of them: data/train-*.parquet)")
        .required()
        .existing_path();
    f.field("format", &ExampleFilesConfig::format,
            "auto: by extension (.parquet, .arrow; a folder: a datasets folder; else JSON lines), or jsonl, parquet, "
            "arrow")
        .one_of({"auto", "jsonl", "parquet", "arrow"});
  }
};

using RowTaker = std::function<void(const nlohmann::ordered_json& row, const std::string& where)>;

// Every row of the files `config.path` names, in order, each a JSON object in its key order (a
// template prints dicts as they come). Tables give the top-level `columns` they have (others
// are not read). tessera::ConfigError on field "path" for what cannot be read: no such file, a
// line that is not a JSON object, a table's error (naming the file and row group), no rows at all.
void for_each_row(const ExampleFilesConfig& config, const std::vector<std::string>& columns, const RowTaker& take);

}  // namespace tessera::chat
