// Hugging Face model folders, the format the Python ecosystem trades weights in: config.json
// (the architecture) plus safetensors weights, either one model.safetensors or shards listed in
// model.safetensors.index.json, and optionally the tokenizer's files. Models read them for
// `init_from` and write them for `checkpoint.export_format: hf`; the name and layout mapping
// between a Hugging Face architecture and a Tessera model belongs to the model plugin.
// Weights are memory-mapped (tessera/formats/safetensors.hpp), never read through Python or pickle.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

// config.json, read-only. Keys may be dotted paths into nested objects
// ("rope_parameters.rope_theta"). An accessor returns nothing when the key is absent or null,
// and throws tessera::Error naming the file and key when it holds another type.
class TESSERA_API HfConfig {
 public:
  HfConfig();
  // Throws tessera::Error naming `file` when `text` is not a JSON object.
  static HfConfig parse(const std::string& text, const std::string& file);

  const std::string& file() const { return file_; }
  bool has(const std::string& key) const;
  std::optional<std::int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;  // integers read as numbers too
  std::optional<std::string> string(const std::string& key) const;
  std::optional<bool> boolean(const std::string& key) const;
  // The file's text as parsed (for messages and tests).
  std::string dump() const;

 private:
  std::string file_;
  std::shared_ptr<const void> json_;  // nlohmann::json, kept out of this header
};

struct HfCheckpoint {
  std::string folder;
  HfConfig config;
  StateDict tensors;                               // every tensor of every weight file, by name
  std::map<std::string, std::string> tensor_file;  // tensor name -> the file it came from
  std::vector<std::string> tokenizer_files;        // paths of the tokenizer files the folder has
};

// The tokenizer files an export carries along when present: tokenizer.json and its
// configuration, SentencePiece's tokenizer.model, GPT-2's vocab.json and merges.txt.
TESSERA_API const std::vector<std::string>& hf_tokenizer_file_names();

// Whether `path` is a folder holding a Hugging Face config.json (one with a model_type; a
// Tessera export's config.json names a variant_key instead).
TESSERA_API bool is_hf_checkpoint(const std::string& path);

// The token ids that end generation with a Hugging Face folder's model: generation_config.json's
// eos_token_id (one id or a list of them), else config.json's; empty when neither names one. A
// value of another type, or a file that is not JSON, is a tessera::Error naming the file.
TESSERA_API std::vector<std::int64_t> hf_eos_token_ids(const std::string& folder);

// Reads config.json and every weight file. A missing shard, a shard that does not hold the
// tensors the index assigns to it, a corrupt file or a tensor in two files is a tessera::Error
// naming the file.
TESSERA_API HfCheckpoint read_hf_checkpoint(const std::string& folder);

// Where one of a model's modules sits in its Hugging Face counterpart (Model::hugging_face_module):
// what PEFT calls it, and whether its weight is stored transposed there (GPT-2's Conv1D, [in,
// out]: PEFT's fan_in_fan_out).
struct HfModuleName {
  std::string name;  // "model.layers.0.self_attn.q_proj"; empty when the module has none
  bool fan_in_fan_out = false;
};

// What a model writes as a Hugging Face folder.
struct HfExport {
  std::string config_json;                // config.json's text
  StateDict tensors;                      // by Hugging Face name, in the Hugging Face layout
  std::vector<std::string> files_to_copy;  // e.g. the tokenizer files of the imported folder
};

// A PEFT adapter folder's contents (tessera/components/adapter.hpp): what peft.PeftModel.from_pretrained
// loads over its base model.
struct PeftExport {
  std::string adapter_config_json;  // adapter_config.json's text
  StateDict tensors;                // adapter_model.safetensors, by PEFT's names
};

// Writes `model` into `folder` (which must exist): config.json, the weights as
// model.safetensors, or above `max_shard_bytes` as model-0000K-of-0000N.safetensors with
// model.safetensors.index.json, and the files to copy. Every file is fsynced.
TESSERA_API void write_hf_checkpoint(const std::string& folder, const HfExport& model, std::uint64_t max_shard_bytes);

// "5GB", "500MB", "2GiB", "123" (bytes), as Hugging Face's max_shard_size; throws
// tessera::Error for anything else.
TESSERA_API std::uint64_t parse_byte_size(const std::string& text);

}  // namespace tessera
