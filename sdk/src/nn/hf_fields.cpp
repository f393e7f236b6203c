#include "tessera/nn/hf_fields.hpp"

#include <optional>
#include <utility>
#include <vector>

namespace tessera::nn::hf_transforms {

namespace {

// A scaled rotary embedding's numbers from rope_parameters (transformers 5) or rope_scaling
// (older files): `type`'s `fields` in order, each required unless it has a fallback; null for
// the plain rotary; any other rope_type refused.
HfIn scaled_rope(const std::string& model, const std::string& type,
                 const std::vector<std::pair<std::string, std::optional<double>>>& fields) {
  return [=](const nlohmann::json&, const nlohmann::json& whole) -> nlohmann::json {
    const std::string key = whole.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
    const nlohmann::json rope = whole.value(key, nlohmann::json());
    if (!rope.is_object()) return nullptr;
    const nlohmann::json named = rope.contains("rope_type") ? rope["rope_type"] : rope.value("type", nlohmann::json());
    if (named.is_null() || named == "default") return nullptr;
    if (named != type) {
      throw ConfigError(key + ".rope_type " + named.dump() + " is not one " + model + " computes (default, " + type + ")",
                        "init_from");
    }
    nlohmann::json numbers = nlohmann::json::array();
    for (const auto& [field, fallback] : fields) {
      if (rope.contains(field) && rope[field].is_number()) {
        numbers.push_back(rope[field].get<double>());
      } else if (fallback) {
        numbers.push_back(*fallback);
      } else {
        throw ConfigError(key + " of type " + type + " lacks " + field, "init_from");
      }
    }
    return numbers;
  };
}

}  // namespace

HfIn llama3_rope(const std::string& model) {
  return scaled_rope(model, "llama3",
                     {{"factor", std::nullopt},
                      {"low_freq_factor", std::nullopt},
                      {"high_freq_factor", std::nullopt},
                      {"original_max_position_embeddings", std::nullopt}});
}

HfIn yarn_rope(const std::string& model) {
  return scaled_rope(model, "yarn",
                     {{"factor", std::nullopt},
                      {"original_max_position_embeddings", std::nullopt},
                      {"beta_fast", 32.0},
                      {"beta_slow", 1.0},
                      {"mscale", 0.0},
                      {"mscale_all_dim", 0.0}});
}

HfIn renamed(const std::map<std::string, std::string>& in, const std::string& model) {
  return [=](const nlohmann::json& v, const nlohmann::json&) -> nlohmann::json {
    if (v.is_null()) return v;
    const auto it = v.is_string() ? in.find(v.get<std::string>()) : in.end();
    if (it != in.end()) return it->second;
    std::string known;
    for (const auto& [spelling, ignored] : in) known += (known.empty() ? "" : ", ") + spelling;
    throw ConfigError(v.dump() + " is not one " + model + " computes (" + known + ")", "init_from");
  };
}

HfOut renamed_out(const std::map<std::string, std::string>& out) {
  return [=](const nlohmann::json& v) -> nlohmann::json {
    const auto it = v.is_string() ? out.find(v.get<std::string>()) : out.end();
    return it != out.end() ? nlohmann::json(it->second) : v;
  };
}

HfOut yarn_rope_out() {
  return [](const nlohmann::json& v) -> nlohmann::json {
    if (!v.is_array() || v.size() != 6) return {{"rope_type", "default"}};
    nlohmann::json out = {{"rope_type", "yarn"},
                          {"factor", v[0]},
                          {"original_max_position_embeddings", static_cast<std::int64_t>(v[1].get<double>())},
                          {"beta_fast", v[2]},
                          {"beta_slow", v[3]}};
    if (v[4] != 0) out["mscale"] = v[4];
    if (v[5] != 0) out["mscale_all_dim"] = v[5];
    return out;
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
