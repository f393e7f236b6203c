// A family's config.json as one table. Each row pairs a YAML field with a Hugging Face key: the
// value when config.json leaves the key out, and named transforms where the two spell a value
// differently (a null for "none", a layer list from a pattern). One engine reads the table four
// ways, so the directions cannot disagree:
//   settle_hf      a Hugging Face folder's config.json settles the fields the YAML leaves out,
//                  and a field the YAML gives otherwise is one error naming both
//   settle_export  the same from a Tessera export's record of the architecture it built
//   hf_config      the export's config.json
//   architecture   the record an export keeps (Model::architecture_json)
// and `expect` rows name the values of config.json keys the family computes (hidden_act silu),
// any other being one error at init_from.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/hf_import.hpp"

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
    nlohmann::json layers = nlohmann::json::array();
    for (std::int64_t i = 0; i < n; ++i) layers.push_back(k > 0 && (i + 1) % k == 0 ? last_kind : kind);
    return layers;
  };
}
}  // namespace hf_transforms

template <class Config>
class HfFieldTable {
 public:
  struct Row {
    std::string yaml;            // the YAML field; empty: a constant of config.json
    std::string hf;              // the key (dotted for nesting); alternatives "a|b", the first written
    nlohmann::json absent;       // the value when config.json lacks the key; discarded: not settled
    std::function<nlohmann::json(const Config&)> get;       // the field as it is meant (derived zeros resolved)
    std::function<void(Config&, const nlohmann::json&)> set;
    HfIn in;
    HfOut out;
    bool compare = true;  // false: config.json's fills the field but never disagrees (max_seq_len)
  };

  // `kind`: "model/gemma3_text", for messages.
  explicit HfFieldTable(std::string kind) : kind_(std::move(kind)) {}

  // The YAML's `member` as config.json's `hf`. `get`: the value it means where the member may
  // say "derived" (0 for n_head's heads).
  template <class T, class Owner>
  HfFieldTable& field(const std::string& yaml, T Owner::*owned, const std::string& hf,
                      nlohmann::json absent = nlohmann::json::value_t::discarded,
                      std::function<T(const Config&)> get = {}) {
    T Config::*member = owned;
    Row row;
    row.yaml = yaml;
    row.hf = hf;
    row.absent = std::move(absent);
    row.get = [member, get](const Config& c) { return nlohmann::json(get ? get(c) : c.*member); };
    row.set = [member](Config& c, const nlohmann::json& v) { c.*member = v.get<T>(); };
    rows_.push_back(std::move(row));
    return *this;
  }
  // The last row's transforms, and whether it compares.
  HfFieldTable& transform(HfIn in, HfOut out = {}) {
    rows_.back().in = std::move(in);
    rows_.back().out = std::move(out);
    return *this;
  }
  HfFieldTable& fill_only() {
    rows_.back().compare = false;
    return *this;
  }
  // A key the export writes from the config (the architecture's name, a rope_type); not read.
  HfFieldTable& written(const std::string& hf, std::function<nlohmann::json(const Config&)> value) {
    Row row;
    row.hf = hf;
    row.get = std::move(value);
    rows_.push_back(std::move(row));
    return *this;
  }
  // config.json's `hf` (`absent` when left out) must be one of `computed`, which the export
  // writes the first of.
  HfFieldTable& expect(const std::string& hf, std::vector<nlohmann::json> computed, nlohmann::json absent) {
    expects_.push_back({hf, std::move(computed), std::move(absent)});
    return *this;
  }

  Config settle_hf(Config c, const HfConfig& file) const {
    const nlohmann::json whole = nlohmann::json::parse(file.dump());
    for (const Row& row : rows_) {
      if (row.yaml.empty()) continue;
      std::optional<nlohmann::json> value = lookup(whole, row.hf);
      if (!value) {
        if (row.absent.is_discarded() && !row.in) continue;
        value = row.absent.is_discarded() ? nlohmann::json(nullptr) : row.absent;
      }
      if (row.in) value = row.in(*value, whole);
      settle(c, row, *value, file.file(), first_key(row.hf));
    }
    for (const Expect& e : expects_) {
      const nlohmann::json value = lookup(whole, e.hf).value_or(e.absent);
      if (std::find(e.computed.begin(), e.computed.end(), value) == e.computed.end()) {
        throw ConfigError(file.file() + ": " + e.hf + " is " + value.dump() + ", which " + kind_ + " does not compute",
                          "init_from");
      }
    }
    return c;
  }

  Config settle_export(Config c, const HfConfig& exported) const {
    const Config defaults;
    for (const Row& row : rows_) {
      if (row.yaml.empty()) continue;
      std::optional<nlohmann::json> value = hf_import::exported_value(exported, row.yaml);
      if (!value) {
        if (hf_import::exported_from_elsewhere(exported)) continue;
        value = row.get(defaults);
      }
      settle(c, row, *value, exported.file(), row.yaml);
    }
    return c;
  }

  nlohmann::ordered_json hf_config(const Config& c) const {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    // The expected values first: a row may write a key they share (a rope_type it chose).
    for (const Expect& e : expects_) place(out, first_key(e.hf), e.computed.front());
    for (const Row& row : rows_) {
      const nlohmann::json value = row.out ? row.out(row.get(c)) : row.get(c);
      if (!value.is_discarded()) place(out, first_key(row.hf), value);
    }
    return out;
  }

  nlohmann::ordered_json architecture(const Config& c) const {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const Row& row : rows_) {
      if (!row.yaml.empty()) out[row.yaml] = row.get(c);
    }
    return out;
  }

 private:
  struct Expect {
    std::string hf;
    std::vector<nlohmann::json> computed;
    nlohmann::json absent;
  };

  static std::string first_key(const std::string& keys) { return keys.substr(0, keys.find('|')); }

  // The value at the first of `keys` ("a.b|c") config.json has.
  static std::optional<nlohmann::json> lookup(const nlohmann::json& whole, const std::string& keys) {
    std::size_t start = 0;
    while (start <= keys.size()) {
      const std::size_t bar = keys.find('|', start);
      const std::string key = keys.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
      const nlohmann::json* at = &whole;
      for (std::size_t from = 0; at && from <= key.size();) {
        const std::size_t dot = key.find('.', from);
        const std::string part = key.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
        at = at->is_object() && at->contains(part) ? &(*at)[part] : nullptr;
        if (dot == std::string::npos) break;
        from = dot + 1;
      }
      if (at) return *at;
      if (bar == std::string::npos) break;
      start = bar + 1;
    }
    return std::nullopt;
  }

  static void place(nlohmann::ordered_json& out, const std::string& key, const nlohmann::json& value) {
    nlohmann::ordered_json* at = &out;
    std::size_t from = 0;
    for (std::size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', from)) {
      at = &(*at)[key.substr(from, dot - from)];
      from = dot + 1;
    }
    (*at)[key.substr(from)] = nlohmann::ordered_json::parse(value.dump());
  }

  static bool same(const nlohmann::json& a, const nlohmann::json& b) {
    if (a.is_number() && b.is_number()) {
      const double x = a.get<double>(), y = b.get<double>();
      return std::abs(x - y) <= 1e-12 * std::max(std::abs(x), std::abs(y));
    }
    if (a.is_array() && b.is_array() && a.size() == b.size()) {
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (!same(a[i], b[i])) return false;
      }
      return true;
    }
    return a == b;
  }

  void settle(Config& c, const Row& row, const nlohmann::json& value, const std::string& file,
              const std::string& key) const {
    const nlohmann::json mine = row.get(c);
    const bool numeric_kind = mine.is_number() && value.is_number();
    if (!numeric_kind && mine.type() != value.type() && !(mine.is_array() && value.is_array())) {
      throw ConfigError(file + ": " + key + " is " + value.dump() + ", not a value of " + row.yaml + " (like " +
                            mine.dump() + ")",
                        "init_from");
    }
    if (mine.is_number_integer() && value.is_number() && value.get<double>() < 0) {
      throw ConfigError(file + ": " + key + " is " + value.dump() + "; it must not be negative", "init_from");
    }
    if (!c.given.count(row.yaml)) {
      row.set(c, value);
    } else if (row.compare && !same(mine, value)) {
      throw ConfigError("the YAML says " + row.yaml + ": " + mine.dump() + " but " + file + " says " + key + ": " +
                            value.dump() + " (leave " + row.yaml + " out to take the checkpoint's)",
                        row.yaml);
    }
  }

  std::string kind_;
  std::vector<Row> rows_;
  std::vector<Expect> expects_;
};

}  // namespace tessera::nn
