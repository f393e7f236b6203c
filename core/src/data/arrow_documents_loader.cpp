// The host's side of Parquet and Arrow input (tessera/core/data/arrow_documents.hpp): the Arrow
// reader module is loaded on first use from the lib/tessera folder beside the binary's bin
// folder (build/lib/tessera in the build tree, PREFIX/lib/tessera installed), so nothing but
// prepare-data on such a file ever loads Arrow.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "tessera/core/data/arrow_documents.hpp"
#include "tessera/error.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

fs::path module_path() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return exe.parent_path().parent_path() / "lib" / "tessera" / kArrowReaderModule;
}

// The module's readers, or why there are none (loaded once; a failed load is not retried).
const ArrowReaders* readers(std::string& why) {
  static std::once_flag once;
  static const ArrowReaders* loaded = nullptr;
  static std::string error;
  std::call_once(once, [] {
    const fs::path path = module_path();
    if (!fs::exists(path)) {
      error = "this Tessera was built without Apache Arrow (no " + path.string() +
              "), so it cannot read Parquet or Arrow files; install pyarrow into the project's .venv "
              "(tools/setup.sh does) and configure again";
      return;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* reason = ::dlerror();
      error = "cannot load the Arrow reader " + path.string() + ": " + (reason ? reason : "unknown error") +
              " (its Arrow libraries come from the pyarrow wheel it was built with)";
      return;
    }
    using Entry = const ArrowReaders* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(handle, "tessera_arrow_readers"));
    if (!entry) {
      error = path.string() + " is not Tessera's Arrow reader (no tessera_arrow_readers)";
      return;
    }
    loaded = entry();
  });
  why = error;
  return loaded;
}

const ArrowReaders& readers_for(const std::string& path) {
  std::string why;
  const ArrowReaders* r = readers(why);
  if (!r) throw ConfigError(path + ": " + why, "");
  return *r;
}

}  // namespace

bool arrow_inputs_available() {
  std::string why;
  return readers(why) != nullptr;
}

void read_parquet_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  readers_for(path).read_parquet(path, field, take);
}

void read_arrow_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  readers_for(path).read_arrow(path, field, take);
}

}  // namespace tessera::core
