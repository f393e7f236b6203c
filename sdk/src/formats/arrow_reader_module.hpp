// What the Arrow reader module (arrow_reader_module.cpp, built as tessera/libtessera_arrow_reader.so
// beside the SDK library) exports through `extern "C" const ArrowReaders* tessera_arrow_readers()`,
// and arrow_tables.cpp loads on first use. Built from the same sources as the SDK, so the C++
// types crossing it are the same.
#pragma once

#include <string>
#include <vector>

#include "tessera/formats/arrow_tables.hpp"

namespace tessera::arrow_module {

struct ArrowReaders {
  void (*read_parquet)(const std::string& path, const std::string& field, const DocumentSink& take);
  void (*read_arrow)(const std::string& path, const std::string& field, const DocumentSink& take);
  void (*read_parquet_rows)(const std::string& path, const std::vector<std::string>& columns, const RowSink& take);
  void (*read_arrow_rows)(const std::string& path, const std::vector<std::string>& columns, const RowSink& take);
};

// The module's readers (arrow_documents.cpp, arrow_rows.cpp), as tessera/formats/arrow_tables.hpp
// describes them.
void parquet_documents(const std::string& path, const std::string& field, const DocumentSink& take);
void arrow_ipc_documents(const std::string& path, const std::string& field, const DocumentSink& take);
void parquet_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take);
void arrow_ipc_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take);

inline constexpr const char* kModuleFolder = "tessera";
inline constexpr const char* kModuleName = "libtessera_arrow_reader.so";

}  // namespace tessera::arrow_module
