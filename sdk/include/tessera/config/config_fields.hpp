// A component's config, declared once: a plain struct whose members hold the values (their
// initialisers are the defaults) and one static declare() that gives each member its YAML key,
// doc and constraints. From that declaration the host gets the schema it lists, describes and
// validates against, and the factory gets the struct filled with validated values:
//
//   struct StepDecayConfig {
//     std::int64_t step_size = 100;
//     double gamma = 0.5;
//     static void declare(tessera::ConfigFields<StepDecayConfig>& f) {
//       f.field("step_size", &StepDecayConfig::step_size, "steps between decays").at_least(1);
//       f.field("gamma", &StepDecayConfig::gamma, "multiplier at each decay").greater_than(0);
//     }
//   };
//   registrar.add<tessera::Scheduler, StepDecayConfig>("step_decay", "lr times gamma every step_size",
//       [](const StepDecayConfig& c) { return std::make_shared<StepDecay>(c); });
//
// Member types and the YAML they take: bool, std::int64_t, double, std::string, and
// std::vector of the last three (lists); std::shared_ptr<Interface> (a nested component of
// Interface::kKind, inline or by reference) and std::vector of those (a list of them, each inline
// or by reference; an empty list when absent); std::optional<T> (may be left out). A field with
// no sensible default calls .required().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/config/component_config.hpp"
#include "tessera/config/schema.hpp"

namespace tessera {

namespace config_fields_detail {

// How a member type is declared in a Schema and read from a validated ComponentConfig.
template <class T, class = void>
struct Field {
  static_assert(sizeof(T) == 0,
                "a config member must be bool, std::int64_t, double, std::string, a std::vector of "
                "std::int64_t/double/std::string, std::shared_ptr<Interface> or std::optional of these");
};

template <>
struct Field<bool> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) { return s.boolean(std::move(n), std::move(d)); }
  static bool read(const ComponentConfig& c, const std::string& n) { return c.boolean(n); }
};
template <>
struct Field<std::int64_t> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) { return s.integer(std::move(n), std::move(d)); }
  static std::int64_t read(const ComponentConfig& c, const std::string& n) { return c.integer(n); }
};
template <>
struct Field<double> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) { return s.number(std::move(n), std::move(d)); }
  static double read(const ComponentConfig& c, const std::string& n) { return c.number(n); }
};
template <>
struct Field<std::string> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) { return s.string(std::move(n), std::move(d)); }
  static std::string read(const ComponentConfig& c, const std::string& n) { return c.string(n); }
};
template <>
struct Field<std::vector<std::int64_t>> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) { return s.integers(std::move(n), std::move(d)); }
  static std::vector<std::int64_t> read(const ComponentConfig& c, const std::string& n) { return c.integers(n); }
};
template <>
struct Field<std::vector<double>> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) { return s.numbers(std::move(n), std::move(d)); }
  static std::vector<double> read(const ComponentConfig& c, const std::string& n) { return c.numbers(n); }
};
template <>
struct Field<std::vector<std::string>> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) { return s.strings(std::move(n), std::move(d)); }
  static std::vector<std::string> read(const ComponentConfig& c, const std::string& n) { return c.strings(n); }
};
// A nested component; required unless the declaration calls .optional() (then null when absent).
template <class Interface>
struct Field<std::shared_ptr<Interface>, std::void_t<decltype(Interface::kKind)>> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) {
    return s.component(std::move(n), Interface::kKind, std::move(d));
  }
};

// A list of nested components; empty when absent.
template <class Interface>
struct Field<std::vector<std::shared_ptr<Interface>>, std::void_t<decltype(Interface::kKind)>> {
  static FieldSpec& declare(Schema& s, std::string n, std::string d) {
    return s.components(std::move(n), Interface::kKind, std::move(d)).optional();
  }
};

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <class T>
struct IsComponent : std::false_type {};
template <class T>
struct IsComponent<std::shared_ptr<T>> : std::true_type {};
template <class T>
struct IsComponentList : std::false_type {};
template <class T>
struct IsComponentList<std::vector<std::shared_ptr<T>>> : std::true_type {};

}  // namespace config_fields_detail

template <class Config>
class ConfigFields {
 public:
  ConfigFields() = default;
  ConfigFields(const ConfigFields&) = delete;
  ConfigFields& operator=(const ConfigFields&) = delete;
  ConfigFields(ConfigFields&&) = default;
  ConfigFields& operator=(ConfigFields&&) = default;

  // Declares `member` as the field `name`. Its type comes from the member; its default is the
  // member's initial value in a default-constructed Config (none for components and optionals).
  // Returns the FieldSpec to chain constraints on: .at_least(1), .one_of({...}), .required().
  // `member` may belong to a base of Config, so related components can share a declared part.
  template <class T, class Owner>
  FieldSpec& field(std::string name, T Owner::*member, std::string doc) {
    static_assert(std::is_base_of_v<Owner, Config>, "the member must belong to Config or a base of it");
    T Config::*target = member;
    namespace detail = config_fields_detail;
    if constexpr (detail::IsOptional<T>::value) {
      using Inner = typename T::value_type;
      // Left out means empty: a member that starts with a value would be a default the schema
      // does not show.
      if ((prototype_.*target).has_value()) {
        throw Error("config field " + name + ": an optional member must start empty; give a plain member a default instead");
      }
      FieldSpec& spec = detail::Field<Inner>::declare(schema_, name, std::move(doc)).optional();
      readers_.push_back([name, target](Config& c, const ComponentConfig& values) {
        if (values.has(name)) c.*target = detail::Field<Inner>::read(values, name);
      });
      return spec;
    } else if constexpr (detail::IsComponent<T>::value) {
      using Interface = typename T::element_type;
      FieldSpec& spec = detail::Field<T>::declare(schema_, name, std::move(doc));
      readers_.push_back([name, target](Config& c, const ComponentConfig& values) {
        if (values.has(name)) c.*target = values.component<Interface>(name);
      });
      return spec;
    } else if constexpr (detail::IsComponentList<T>::value) {
      using Interface = typename T::value_type::element_type;
      FieldSpec& spec = detail::Field<T>::declare(schema_, name, std::move(doc));
      readers_.push_back([name, target](Config& c, const ComponentConfig& values) {
        if (values.has(name)) c.*target = values.components<Interface>(name);
      });
      return spec;
    } else {
      FieldSpec& spec = detail::Field<T>::declare(schema_, name, std::move(doc)).default_to(prototype_.*target);
      readers_.push_back([name, target](Config& c, const ComponentConfig& values) {
        c.*target = detail::Field<T>::read(values, name);
      });
      return spec;
    }
  }

  // Fills `member` with the names of the fields the YAML wrote itself, for a component whose
  // defaults yield to another source (a model taking what the YAML leaves out from the
  // checkpoint it imports).
  void record_given(std::set<std::string> Config::*member) {
    readers_.push_back([member](Config& c, const ComponentConfig& values) { c.*member = values.given_names(); });
  }

  // Fills `member` with the variants ("math_answer") of the components the list field `name`
  // holds, in order ("" for a reference during validation): names to report them by.
  void record_variants(std::string name, std::vector<std::string> Config::*member) {
    readers_.push_back([name, member](Config& c, const ComponentConfig& values) {
      if (!values.has(name)) return;
      for (const ComponentHandle& h : values.handles(name)) (c.*member).push_back(h.variant);
    });
  }

  // A rule over several fields (or one the schema cannot express). It throws
  // tessera::ConfigError(message, field) for a bad config. Rules run when the host validates a
  // run (`tessera validate`, before anything is built) and before the factory: nested
  // components are null during validation, so a rule must not use them.
  void check(std::function<void(const Config&)> rule) { rules_.push_back(std::move(rule)); }
  // A rule that needs the run: its `parallelism:` degrees (RunContext::parallel), to refuse, say,
  // heads that do not divide over the tensor-parallel ranks. Runs when the other rules do.
  void check_in_run(std::function<void(const Config&, const RunContext&)> rule) {
    run_rules_.push_back(std::move(rule));
  }
  // The component splits its work over this mesh axis (Schema::splits_over).
  void splits_over(MeshAxis axis) { schema_.splits_over(axis_name(axis)); }
  // ... and over the sequence under tensor parallelism (parallelism.sequence_parallel).
  void splits_sequence() { schema_.splits_over("sequence_parallel"); }
  // ... and its experts over expert-parallel ranks (parallelism.ep).
  void splits_experts() { schema_.splits_over("ep"); }

  const Schema& schema() const { return schema_; }

  // The typed config from values the host validated against schema(); rules checked.
  Config read(const ComponentConfig& values) const {
    Config config = prototype_;
    for (const auto& reader : readers_) reader(config, values);
    for (const auto& rule : rules_) rule(config);
    for (const auto& rule : run_rules_) rule(config, values.context());
    return config;
  }

 private:
  Config prototype_{};
  Schema schema_;
  std::vector<std::function<void(Config&, const ComponentConfig&)>> readers_;
  std::vector<std::function<void(const Config&)>> rules_;
  std::vector<std::function<void(const Config&, const RunContext&)>> run_rules_;
};

// The declaration Config::declare makes.
template <class Config>
ConfigFields<Config> declared_fields() {
  ConfigFields<Config> fields;
  Config::declare(fields);
  return fields;
}

// For components that take no config.
struct NoConfig {
  static void declare(ConfigFields<NoConfig>&) {}
};

}  // namespace tessera
