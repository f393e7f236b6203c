// The stand-in for builds without Apache Arrow (cmake/TesseraArrow.cmake found no pyarrow): Parquet
// and Arrow inputs are refused in one line saying how to get them.
#include "tessera/core/data/arrow_documents.hpp"

#include "tessera/error.hpp"

namespace tessera::core {
namespace {

[[noreturn]] void missing(const std::string& path) {
  throw ConfigError(path + ": this Tessera was built without Apache Arrow, so it cannot read Parquet or Arrow files; "
                           "install pyarrow into the project's .venv (tools/setup.sh does) and configure again",
                    "");
}

}  // namespace

bool arrow_inputs_available() { return false; }

void read_parquet_documents(const std::string& path, const std::string&, const DocumentSink&) { missing(path); }

void read_arrow_documents(const std::string& path, const std::string&, const DocumentSink&) { missing(path); }

}  // namespace tessera::core
