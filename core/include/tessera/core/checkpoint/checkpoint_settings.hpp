// The `checkpoint` section of a run spec (docs/checkpointing.md): when to save and export, how
// many to keep, whether to write in the background. Declared once (tessera/config/config_fields.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"

namespace tessera::core {

struct CheckpointSettings {
  std::optional<std::string> dir;  // absent: RUN_DIR/checkpoints (the run plan resolves it)
  std::int64_t every_steps = 0;    // 0: only at the end and when a callback asks
  std::int64_t keep_last = 0;      // 0: keep all
  bool at_end = true;
  bool async = true;
  std::int64_t export_every_steps = 0;
  bool export_at_end = true;
  std::string export_format = "tessera";  // tessera, or hf: a folder transformers loads
  std::string export_max_shard_size = "5GB";  // hf: larger weights are split into indexed shards
  std::string export_tokenizer;  // hf: a tokenizer file or folder whose tokenizer files go with each export

  static void declare(ConfigFields<CheckpointSettings>& f);
};

// The tokenizer files at `path`: the file itself, or the known ones a folder holds (none if
// neither).
std::vector<std::string> tokenizer_files_at(const std::string& path);

// An export's config.json: the model's component spec as the YAML wrote it
// (`model_config_json`), its config completed by the architecture the model was built with
// (Model::architecture_json; "" leaves it as it is), so that init_from of the export knows every
// field, also those the run took from its own init_from.
std::string export_config_json(const std::string& model_config_json, const std::string& architecture_json);

}  // namespace tessera::core
