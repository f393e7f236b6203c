// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, then the raw
// little-endian bytes. Tessera writes model exports and every tensor file of a checkpoint in it.
// The reader trusts nothing in the file: any inconsistency is a tessera::Error naming the file.
#pragma once

#include <map>
#include <string>

#include "tessera/formats/durable_file.hpp"
#include "tessera/export.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

struct SafetensorsFile {
  StateDict tensors;
  std::map<std::string, std::string> metadata;  // the header's __metadata__
};

// Writes `tensors` (any device; copied to host) in key order, fsynced before it returns.
TESSERA_API WrittenFile write_safetensors(const std::string& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata = {});
TESSERA_API SafetensorsFile read_safetensors(const std::string& path);
// The same from bytes in memory; `name` is used in error messages.
TESSERA_API SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& name);

}  // namespace tessera
