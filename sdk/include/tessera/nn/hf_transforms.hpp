// The named transforms of a family's config table (tessera/nn/hf_fields.hpp): how config.json
// spells a value the YAML spells otherwise (a null for "none", a layer list from a pattern, Llama
// 3's and YaRN's RoPE scalings, renamed activations), and how values convert and show.
#pragma once

#include <nlohmann/json.hpp>

#include <c10/util/StringUtil.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>

#include "tessera/export.hpp"
#include "tessera/nn/layer_kinds.hpp"

namespace tessera::nn {

// A value as config.json spells it -> as the YAML does, given the whole config.json (Gemma's
// layer_types from sliding_window_pattern and num_hidden_layers).
using HfIn = std::function<nlohmann::json(const nlohmann::json& value, const nlohmann::json& whole)>;
// The YAML's value -> config.json's spelling; a discarded json: the key is not written.
using HfOut = std::function<nlohmann::json(const nlohmann::json& value)>;

// Named transforms.
namespace hf_transforms {
// 0 in the YAML is "none", null in config.json (Gemma's softcapping, a window).
inline HfIn null_as_zero() {
  return [](const nlohmann::json& v, const nlohmann::json&) { return v.is_null() ? nlohmann::json(0) : v; };
}
inline HfOut zero_as_null() {
  return [](const nlohmann::json& v) { return v == 0 ? nlohmann::json(nullptr) : v; };
}
// Not written when the value is `none` (a rope scaling factor of 1).
inline HfOut omitted_when(nlohmann::json none) {
  return [none](const nlohmann::json& v) { return v == none ? nlohmann::json(nlohmann::json::value_t::discarded) : v; };
}
// A list of layer kinds: config.json's, or every `every`-th layer `last_kind` and the others
// `kind` (Gemma's sliding_window_pattern: `pattern_key`, default `every`).
inline HfIn layers_from_pattern(std::string pattern_key, std::int64_t every, std::string kind, std::string last_kind) {
  return [=](const nlohmann::json& v, const nlohmann::json& whole) {
    if (!v.is_null()) return v;
    const std::int64_t n = whole.value("num_hidden_layers", std::int64_t{0});
    const std::int64_t k = whole.contains(pattern_key) ? whole.at(pattern_key).get<std::int64_t>() : every;
    return nlohmann::json(layer_kinds({}, n, k, kind, last_kind));
  };
}
// Absent: config.json's `other` key (num_key_value_heads: num_attention_heads).
inline HfIn or_key(std::string other) {
  return [=](const nlohmann::json& v, const nlohmann::json& whole) {
    return v.is_null() && whole.contains(other) ? whole.at(other) : v;
  };
}
// Absent: `numerator` / `denominator` of config.json (head_dim: hidden_size / num_attention_heads).
inline HfIn or_quotient(std::string numerator, std::string denominator) {
  return [=](const nlohmann::json& v, const nlohmann::json& whole) {
    if (!v.is_null() || !whole.contains(numerator) || !whole.contains(denominator)) return v;
    const auto d = whole.at(denominator).get<std::int64_t>();
    return d > 0 ? nlohmann::json(whole.at(numerator).get<std::int64_t>() / d) : v;
  };
}
// The value where config.json's boolean `flag` is true, else `off` (the Qwens' sliding_window
// under use_sliding_window: 0; their max_window_layers: discarded, not settled).
inline HfIn switched_by(std::string flag, nlohmann::json off) {
  return [=](const nlohmann::json& v, const nlohmann::json& whole) {
    const bool on = whole.contains(flag) && whole.at(flag).is_boolean() && whole.at(flag).get<bool>();
    if (!on) return off;
    return v.is_null() && off.is_number() ? off : v;
  };
}
// Llama 3's RoPE scaling, [factor, low_freq_factor, high_freq_factor, original_max_positions],
// from transformers 5's rope_parameters or the older rope_scaling (rope_type llama3; default or
// none: null); any other rope_type is refused.
TESSERA_API HfIn llama3_rope(const std::string& model);
TESSERA_API HfOut llama3_rope_out();
// YaRN (DeepSeek-V3's), [factor, original_max_positions, beta_fast, beta_slow, mscale,
// mscale_all_dim] (0 for an mscale: none), the same way; written as rope_parameters' fields.
TESSERA_API HfIn yarn_rope(const std::string& model);
TESSERA_API HfOut yarn_rope_out();
// A value config.json spells otherwise: `in` maps its spellings to the YAML's (any other is
// refused, naming `model`), `out` the YAML's back.
TESSERA_API HfIn renamed(const std::map<std::string, std::string>& in, const std::string& model);
TESSERA_API HfOut renamed_out(const std::map<std::string, std::string>& out);
// A null list is an empty one (mlp_only_layers).
inline HfIn null_as_empty() {
  return [](const nlohmann::json& v, const nlohmann::json&) { return v.is_null() ? nlohmann::json::array() : v; };
}
}  // namespace hf_transforms

// The Tessera model that imports a Hugging Face model_type, for the error that names it.
inline std::string tessera_model_for(const std::string& model_type) {
  static const std::map<std::string, std::string> known = {
      {"gpt2", "gpt"},     {"llama", "llama"},   {"mixtral", "llama"},         {"qwen2", "qwen2"},
      {"qwen3", "qwen3"},  {"qwen3_moe", "qwen3_moe"}, {"deepseek_v3", "deepseek_v3"}, {"gemma3_text", "gemma3_text"}};
  const auto it = known.find(model_type);
  return it == known.end() ? "" : it->second;
}

namespace hf_fields_detail {
template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <class T>
nlohmann::json to_json(const T& v) {
  if constexpr (IsOptional<T>::value) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  } else {
    return nlohmann::json(v);
  }
}
template <class T>
T from_json(const nlohmann::json& v) {
  if constexpr (IsOptional<T>::value) {
    return v.is_null() ? T() : T(v.get<typename T::value_type>());
  } else {
    return v.get<T>();
  }
}
// A value in a message as the YAML would write it: 10000 for 10000.0, 'silu' for strings.
inline std::string shown(const nlohmann::json& v) {
  if (v.is_number_float()) return c10::str(v.get<double>());
  if (v.is_string()) return "'" + v.get<std::string>() + "'";
  return v.dump();
}
}  // namespace hf_fields_detail

}  // namespace tessera::nn
