#include "tessera/nn/hf_fields.hpp"

namespace tessera::nn::hf_transforms {

HfIn llama3_rope(const std::string& model) {
  return [model](const nlohmann::json&, const nlohmann::json& whole) -> nlohmann::json {
    const std::string key = whole.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
    const nlohmann::json rope = whole.value(key, nlohmann::json());
    if (!rope.is_object()) return nullptr;
    const nlohmann::json type = rope.contains("rope_type") ? rope["rope_type"] : rope.value("type", nlohmann::json());
    if (type.is_null() || type == "default") return nullptr;
    if (type != "llama3") {
      throw ConfigError(key + ".rope_type " + type.dump() + " is not one " + model + " computes (default, llama3)",
                        "init_from");
    }
    nlohmann::json scaling = nlohmann::json::array();
    for (const char* field : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!rope.contains(field) || !rope[field].is_number()) {
        throw ConfigError(key + " of type llama3 lacks " + field, "init_from");
      }
      scaling.push_back(rope[field].get<double>());
    }
    return scaling;
  };
}

HfOut llama3_rope_out() {
  return [](const nlohmann::json& v) -> nlohmann::json {
    if (!v.is_array() || v.size() != 4) return nullptr;
    return {{"rope_type", "llama3"},
            {"factor", v[0]},
            {"low_freq_factor", v[1]},
            {"high_freq_factor", v[2]},
            {"original_max_position_embeddings", static_cast<std::int64_t>(v[3].get<double>())}};
  };
}

}  // namespace tessera::nn::hf_transforms
