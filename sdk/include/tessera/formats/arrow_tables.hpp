// Tables in Apache Arrow's formats, as corpora and fine-tuning sets ship: Parquet files (FineWeb,
// DCLM, most Hugging Face dataset repositories) and the Arrow IPC files of a Hugging Face
// `datasets` folder (save_to_disk). `tessera prepare-data` reads documents from them; datasets
// (dataset/sft_jsonl, dataset/preference_jsonl) read rows. Read through the Arrow C++ library
// from the pyarrow wheel (cmake/TesseraArrow.cmake), one record batch at a time: memory holds a
// batch, never a whole file. The reading lives in a module of its own, tessera/
// libtessera_arrow_reader.so beside the SDK library, loaded on first use: nothing else ever
// loads Arrow's 60 MB (a training run from token files, a GPU bundle). Where it is missing
// (built without pyarrow) or cannot load, the readers throw a ConfigError saying so. This
// interface is C++17; only the module includes Arrow's (C++20) headers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

// Called with each document's text and where it came from ("FILE: row group G, row R" for
// Parquet, "FILE: record batch B, row R" for Arrow IPC), in file order.
using DocumentSink = std::function<void(std::string text, const std::string& where)>;

// Called with each row as the text of a JSON object and where it came from (as above), in file
// order. Values are as `datasets` gives them to Python: structs objects, lists arrays, nulls
// null, a dictionary column its values; a type JSON lacks (dates, decimals) its text.
using RowSink = std::function<void(const std::string& json_object, const std::string& where)>;

// Whether this build reads Parquet and Arrow IPC files.
TESSERA_API bool arrow_inputs_available();

// Every row group of the Parquet file at `path`, in order; `field` names the text column, a nested
// one as "a.b" (field b of struct column a). Strings, large strings, string views and
// dictionary-encoded strings are taken; every codec the library has (snappy, zstd, gzip, brotli,
// lz4, none). Throws ConfigError naming the file (and the row group or the column): not a
// Parquet file, truncated or corrupt, no such column (with the columns it has), a column that
// is not text (with its type), a null value.
TESSERA_API void read_parquet_documents(const std::string& path, const std::string& field, const DocumentSink& take);

// The same for an Arrow IPC file (stream or file format), as `datasets` writes data-*.arrow.
TESSERA_API void read_arrow_documents(const std::string& path, const std::string& field, const DocumentSink& take);

// Every row of the Parquet file at `path`, in order, holding the top-level `columns` the file has
// (a row lacks the others; empty: every column). Throws ConfigError naming the file and the row
// group for what cannot be read, and for a binary column asked for (JSON holds no bytes).
TESSERA_API void read_parquet_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take);

// The same for an Arrow IPC file.
TESSERA_API void read_arrow_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take);

// The Arrow files of a `datasets` folder (dataset_info.json beside data-*.arrow), in the order its
// state.json lists them (else by name). Throws ConfigError for a folder that is not one (a
// DatasetDict's top folder: name one split's folder).
TESSERA_API std::vector<std::string> datasets_folder_files(const std::string& folder);

// What a path names: a quoted glob's matches in name order (a path that exists is itself, even
// with glob characters), each `datasets` folder as its Arrow files. Throws ConfigError for a
// pattern that matches nothing.
TESSERA_API std::vector<std::string> table_files(const std::string& path);

// How a file is read: by its extension (.parquet, .arrow), else as text or JSON lines.
enum class TableFormat { parquet, arrow, other };
TESSERA_API TableFormat table_format_of(const std::string& path);

}  // namespace tessera
