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
// any other being one error at init_from. Rows that hold for some of a family's variants only say
// so (`when`), instead of branches in the family's code.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include <c10/util/StringUtil.h>

#include "tessera/export.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/hf_transforms.hpp"

namespace tessera::nn {

template <class Config>
class HfFieldTable {
 public:
  using Predicate = std::function<bool(const Config&)>;
  struct Row {
    std::string yaml;       // the YAML field; empty: a key config.json is written with only
    std::string hf;         // the key (dotted for nesting); alternatives "a|b", the first written
    nlohmann::json absent;  // the value when config.json lacks the key; discarded: not settled
    std::function<nlohmann::json(const Config&)> get;  // the field as it is meant (derived zeros resolved)
    std::function<void(Config&, const nlohmann::json&)> set;
    std::function<void(Config&, const Config&)> reset;  // the member back to the variant's default
    // A Tessera export's value of the field as that run's YAML reader read it (an integral 1e3 an
    // integer, "True" a boolean); nullopt when the export does not name it.
    std::function<std::optional<nlohmann::json>(const HfConfig&, const std::string&)> exported;
    HfIn in;                // config.json's spelling -> the YAML's; discarded: not settled
    bool nullable = false;  // the member holds "none" as null (std::optional)
    HfOut out;
    Predicate when;         // the variants the row holds for; empty: all
    bool compare = true;    // false: config.json's fills the field but never disagrees (max_seq_len)
    std::int64_t at_least = 1;  // of an integer from config.json (counts: at least 1)
  };
  // After settling from config.json: a rule across keys (Mixtral's window against its sequences),
  // saying what in config.json the model does not compute ("" when nothing).
  using Rule = std::function<std::string(const Config&, const nlohmann::json& whole)>;

  // `kind`: the model's name in messages ("model/gemma3_text"), by variant.
  explicit HfFieldTable(std::function<std::string(const Config&)> kind) : kind_(std::move(kind)) {}
  explicit HfFieldTable(const std::string& kind) : kind_([kind](const Config&) { return kind; }) {}

  // The model_types config.json may name (by variant); any other is one error naming the model
  // that imports it.
  HfFieldTable& imports(std::function<std::vector<std::string>(const Config&)> model_types) {
    model_types_ = std::move(model_types);
    return *this;
  }
  // The default configs the variants' left-out fields stand for (settle_export); Config{} when unset.
  HfFieldTable& defaults(std::function<Config(const Config&)> of) {
    defaults_ = std::move(of);
    return *this;
  }

  // A family that is one Hugging Face architecture: config.json's architectures and model_type,
  // the only model_type it imports.
  HfFieldTable& architecture(const std::string& name, const std::string& model_type) {
    written("architectures", [name](const Config&) { return nlohmann::json::array({name}); });
    written("model_type", [model_type](const Config&) { return model_type; });
    return imports([model_type](const Config&) { return std::vector<std::string>{model_type}; });
  }

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
    row.get = [member, get](const Config& c) { return hf_fields_detail::to_json(get ? get(c) : c.*member); };
    row.set = [member](Config& c, const nlohmann::json& v) { c.*member = hf_fields_detail::from_json<T>(v); };
    row.reset = [member](Config& c, const Config& d) { c.*member = d.*member; };
    row.nullable = hf_fields_detail::IsOptional<T>::value;
    row.exported = [](const HfConfig& file, const std::string& key) -> std::optional<nlohmann::json> {
      if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                    std::is_same_v<T, std::string>) {
        if (const std::optional<T> value = hf_import::read_exported<T>(file, key)) return nlohmann::json(*value);
      }
      // Named with null ("none", a Llama's rope_scaling) or a list: as written.
      const nlohmann::json all = nlohmann::json::parse(file.dump());
      const auto fields = all.find("config");
      if (fields == all.end() || !fields->is_object() || !fields->contains(key)) return std::nullopt;
      return (*fields)[key];
    };
    rows_.push_back(std::move(row));
    return *this;
  }
  // The last row's transforms, variants, and how it settles.
  HfFieldTable& transform(HfIn in, HfOut out = {}) {
    rows_.back().in = std::move(in);
    rows_.back().out = std::move(out);
    return *this;
  }
  HfFieldTable& when(Predicate holds) {
    rows_.back().when = std::move(holds);
    return *this;
  }
  // 0 in the YAML is "none", null in config.json (a softcap, a window).
  HfFieldTable& zero_is_null() { return transform(hf_transforms::null_as_zero(), hf_transforms::zero_as_null()); }
  HfFieldTable& fill_only() {
    rows_.back().compare = false;
    return *this;
  }
  HfFieldTable& at_least(std::int64_t n) {
    rows_.back().at_least = n;
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
  HfFieldTable& expect(const std::string& hf, std::vector<nlohmann::json> computed, nlohmann::json absent,
                       Predicate holds = {}) {
    expects_.push_back({hf, std::move(computed), std::move(absent), std::move(holds)});
    return *this;
  }
  HfFieldTable& rule(Rule r) {
    rules_.push_back(std::move(r));
    return *this;
  }

  Config settle_hf(Config c, const HfConfig& file) const {
    const nlohmann::json whole = nlohmann::json::parse(file.dump());
    check_model_type(c, whole, file.file());
    for (const Row& row : rows_) {
      if (row.yaml.empty() || row.hf.empty() || (row.when && !row.when(c))) continue;
      std::optional<nlohmann::json> value = lookup(whole, row.hf);
      if (!value) {
        if (row.absent.is_discarded() && !row.in) continue;
        value = row.absent.is_discarded() ? nlohmann::json(nullptr) : row.absent;
      }
      const nlohmann::json raw = *value;
      if (row.in) {
        try {
          value = row.in(*value, whole);
        } catch (const ConfigError& e) {
          throw ConfigError(file.file() + ": " + e.what(), "init_from");
        } catch (const nlohmann::json::exception&) {
          throw ConfigError(file.file() + ": " + first_key(row.hf) + " is " + raw.dump() + ", not what " + row.yaml +
                                " is read from",
                            "init_from");
        }
      }
      if (value->is_discarded() || (value->is_null() && !row.nullable)) continue;
      settle(c, row, *value, file.file(), first_key(row.hf), raw);
    }
    for (const Expect& e : expects_) {
      if (e.when && !e.when(c)) continue;
      const nlohmann::json value = lookup(whole, e.hf).value_or(e.absent);
      if (std::find(e.computed.begin(), e.computed.end(), value) == e.computed.end()) {
        throw ConfigError(file.file() + ": " + first_key(e.hf) + " is " + hf_fields_detail::shown(value) + ", which " +
                              kind_(c) + " does not compute",
                          "init_from");
      }
    }
    for (const Rule& r : rules_) {
      if (const std::string refused = r(c, whole); !refused.empty()) {
        throw ConfigError(file.file() + ": " + refused + ", which " + kind_(c) + " does not compute", "init_from");
      }
    }
    return c;
  }

  // From a Tessera export's config.json (its "config": the fields of the run that wrote it and
  // the architecture it built). A field it leaves out stands for its default, unless that run took
  // its architecture from an init_from of its own: then it is unknown and not settled.
  Config settle_export(Config c, const HfConfig& exported) const {
    const bool unknown_if_absent = hf_import::exported_from_elsewhere(exported);
    const Config defaults = defaults_ ? defaults_(c) : Config{};
    for (const Row& row : rows_) {
      if (row.yaml.empty() || (row.when && !row.when(c))) continue;
      const std::optional<nlohmann::json> written = row.exported(exported, row.yaml);
      if (!written && unknown_if_absent) continue;
      nlohmann::json value;
      if (written) {
        value = *written;
      } else {
        Config probe = c;  // what the default means in this config (0: derived from it)
        row.reset(probe, defaults);
        value = row.get(probe);
      }
      settle(c, row, value, exported.file(), row.yaml, value, written ? "" : "left out, so the default");
    }
    return c;
  }

  nlohmann::ordered_json hf_config(const Config& c) const {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    // The expected values first: a row may write a key they share (a rope_type it chose).
    for (const Expect& e : expects_) {
      if (!e.when || e.when(c)) place(out, first_key(e.hf), e.computed.front());
    }
    for (const Row& row : rows_) {
      if (row.hf.empty() || (row.when && !row.when(c))) continue;
      const nlohmann::json value = row.out ? row.out(row.get(c)) : row.get(c);
      if (!value.is_discarded()) place(out, first_key(row.hf), value);
    }
    return out;
  }

  nlohmann::ordered_json architecture(const Config& c) const {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const Row& row : rows_) {
      if (!row.yaml.empty() && (!row.when || row.when(c))) out[row.yaml] = row.get(c);
    }
    return out;
  }

 private:
  struct Expect {
    std::string hf;
    std::vector<nlohmann::json> computed;
    nlohmann::json absent;
    Predicate when;
  };

  void check_model_type(const Config& c, const nlohmann::json& whole, const std::string& file) const {
    if (!model_types_) return;
    const std::vector<std::string> accepted = model_types_(c);
    const std::string type = whole.contains("model_type") && whole["model_type"].is_string() ? whole["model_type"].get<std::string>() : "";
    if (std::find(accepted.begin(), accepted.end(), type) != accepted.end()) return;
    std::string list;
    for (const std::string& t : accepted) list += (list.empty() ? "" : ", ") + t;
    const std::string theirs = tessera_model_for(type);
    throw ConfigError(file + ": model_type '" + type + "' is not one " + kind_(c) + " imports (" + list +
                          (theirs.empty() ? "" : "; use model/" + theirs) + ")",
                      "init_from");
  }

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
    nlohmann::ordered_json& target = (*at)[key.substr(from)];
    const nlohmann::ordered_json written = nlohmann::ordered_json::parse(value.dump());
    if (target.is_object() && written.is_object()) {
      target.update(written);  // rows that share an object (rope_parameters' theta and its type)
    } else {
      target = written;
    }
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

  // `raw`: config.json's value as the file spells it, shown beside the YAML's spelling.
  void settle(Config& c, const Row& row, const nlohmann::json& value, const std::string& file, const std::string& key,
              const nlohmann::json& raw, const std::string& as_written = "") const {
    using hf_fields_detail::shown;
    const nlohmann::json mine = row.get(c);
    if (mine.is_number_integer() && value.is_number() && value.get<double>() < static_cast<double>(row.at_least)) {
      throw ConfigError(file + " says " + key + ": " + shown(value) + "; it must be at least " +
                            std::to_string(row.at_least),
                        "init_from");
    }
    Config taken = c;
    try {
      row.set(taken, value);
    } catch (const nlohmann::json::exception&) {
      throw ConfigError(file + ": " + key + " is " + value.dump() + ", not a value of " + row.yaml + " (like " +
                            mine.dump() + ")",
                        "init_from");
    }
    if (!c.given.count(row.yaml)) {
      c = std::move(taken);
    } else if (row.compare && !same(mine, row.get(taken))) {
      const nlohmann::json theirs = row.get(taken);
      if (mine.is_array() || theirs.is_array()) {
        throw ConfigError("the YAML's " + row.yaml + " differs from " + file + "'s " + key + " (" + shown(theirs) +
                              "); leave " + row.yaml + " out to take the checkpoint's",
                          row.yaml);
      }
      const std::string said = !as_written.empty() ? as_written + " (" + shown(value) + ")"
                               : raw == value       ? shown(value)
                                                    : shown(raw) + " (" + shown(value) + ")";
      throw ConfigError("the YAML says " + row.yaml + ": " + shown(mine) + " but " + file + " says " + key + ": " + said +
                            " (leave " + row.yaml + " out to take the checkpoint's)",
                        row.yaml);
    }
  }

  std::function<std::string(const Config&)> kind_;
  std::function<std::vector<std::string>(const Config&)> model_types_;
  std::function<Config(const Config&)> defaults_;
  std::vector<Row> rows_;
  std::vector<Expect> expects_;
  std::vector<Rule> rules_;
};

// The rows every ...ForCausalLM of the Llama lineage shares: the decoder fields' sizes under
// transformers' names (max_position_embeddings filling max_seq_len only: no weight depends on it
// with rotary positions); written, the attention's dropout, the init's scale, float32, and no
// special token ids (an imported checkpoint's are carried over them: describe_by_table), rather
// than transformers' defaults for another tokenizer.
template <class Config>
void causal_lm_rows(HfFieldTable<Config>& f) {
  f.field("vocab_size", &Config::vocab_size, "vocab_size").field("n_layer", &Config::n_layer, "num_hidden_layers");
  f.field("n_head", &Config::n_head, "num_attention_heads").field("n_embd", &Config::n_embd, "hidden_size");
  f.field("max_seq_len", &Config::max_seq_len, "max_position_embeddings").fill_only();
  f.written("attention_dropout", [](const Config& c) { return c.dropout; });
  f.written("initializer_range", [](const Config& c) { return c.init_std; });
  for (const char* id : {"bos_token_id", "eos_token_id"}) f.written(id, [](const Config&) { return nullptr; });
  f.written("dtype", [](const Config&) { return "float32"; });
}

// The YAML's config with init_from's config.json settled in by `table` (a Hugging Face folder's,
// or a Tessera export's record), then `check`ed; `variant`: the model's variant key, which a
// Tessera export must name.
template <class Config, class Check>
Config settled_by_table(const Config& yaml, const std::string& variant, const HfFieldTable<Config>& table, Check check) {
  const auto checked = [&](Config c) {
    check(c);
    return c;
  };
  return hf_import::settled_by_init_from(
      yaml, variant, [&](const Config& c, const HfConfig& e) { return checked(table.settle_export(c, e)); },
      [&](const Config& c, const HfConfig& j) { return checked(table.settle_hf(c, j)); });
}

}  // namespace tessera::nn
