// Step-keyed JSON lines kept up to a resumed step (tessera/formats/jsonl_steps.hpp).
#include "tessera/formats/jsonl_steps.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "tessera/error.hpp"

namespace tessera {

void keep_jsonl_steps_up_to(const std::filesystem::path& path, std::int64_t step) {
  std::string kept;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (row.is_object() && row.contains("step") && row["step"].is_number_integer() &&
          row["step"].get<std::int64_t>() <= step) {
        kept += line + "\n";
      }
    }
  }
  const std::filesystem::path tmp = path.string() + ".tmp";
  std::ofstream(tmp, std::ios::out | std::ios::trunc) << kept;
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) throw Error("cannot replace " + path.string() + ": " + error.message());
}

}  // namespace tessera
