// The Arrow reader module's entry (arrow_reader_module.hpp): what tessera/formats/arrow_tables.hpp's
// functions call once the SDK has loaded tessera/libtessera_arrow_reader.so.
#include "arrow_reader_module.hpp"

extern "C" __attribute__((visibility("default"))) const tessera::arrow_module::ArrowReaders* tessera_arrow_readers() {
  using namespace tessera::arrow_module;
  static const ArrowReaders readers{&parquet_documents, &arrow_ipc_documents, &parquet_rows, &arrow_ipc_rows};
  return &readers;
}
