// Documents from Apache Arrow's formats, for `tessera prepare-data`: Parquet files (FineWeb, DCLM,
// most Hugging Face dataset repositories) and the Arrow IPC files of a Hugging Face `datasets`
// folder (save_to_disk). Read through the Arrow C++ library from the pyarrow wheel
// (cmake/TesseraArrow.cmake), one record batch of one column at a time: memory holds a batch,
// never a whole file. The reading lives in a module of its own, lib/tessera/
// libtessera_arrow_reader.so beside the binary's lib folder, loaded on first use: the host
// never loads Arrow's 60 MB for anything else (a training run, a GPU bundle). Where it is
// missing (built without pyarrow) or cannot load, the readers throw a ConfigError saying so. The
// interface is C++17; only the module includes Arrow's (C++20) headers.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tessera::core {

// Called with each document's text and where it came from ("FILE: row group G, row R" for
// Parquet, "FILE: record batch B, row R" for Arrow IPC), in file order.
using DocumentSink = std::function<void(std::string text, const std::string& where)>;

// Whether this build reads Parquet and Arrow IPC files.
bool arrow_inputs_available();

// Every row group of the Parquet file at `path`, in order; `field` names the text column, a nested
// one as "a.b" (field b of struct column a). Strings, large strings, string views and
// dictionary-encoded strings are taken; every codec the library has (snappy, zstd, gzip, brotli,
// lz4, none). Throws ConfigError naming the file (and the row group or the column): not a
// Parquet file, truncated or corrupt, no such column (with the columns it has), a column that
// is not text (with its type), a null value.
void read_parquet_documents(const std::string& path, const std::string& field, const DocumentSink& take);

// The same for an Arrow IPC file (stream or file format), as `datasets` writes data-*.arrow.
void read_arrow_documents(const std::string& path, const std::string& field, const DocumentSink& take);

// The Arrow files of a `datasets` folder (dataset_info.json beside data-*.arrow), in the order its
// state.json lists them (else by name). Throws ConfigError for a folder that is not one (a
// DatasetDict's top folder: name one split's folder).
std::vector<std::string> datasets_folder_files(const std::string& folder);

// What the module exports, through `extern "C" const ArrowReaders* tessera_arrow_readers()`.
struct ArrowReaders {
  void (*read_parquet)(const std::string& path, const std::string& field, const DocumentSink& take);
  void (*read_arrow)(const std::string& path, const std::string& field, const DocumentSink& take);
};
inline constexpr const char* kArrowReaderModule = "libtessera_arrow_reader.so";

}  // namespace tessera::core
