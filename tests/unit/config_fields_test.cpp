// Configs declared once (tessera/config/config_fields.hpp): the schema comes from the struct and its
// declare(), defaults from the members' initialisers, values back into the struct, rules.
#include "tessera/config/config_fields.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/components/loss.hpp"

namespace tessera {
namespace config_fields_test {

struct Shared {
  std::int64_t width = 64;
};

struct Everything : Shared {
  bool flag = true;
  std::int64_t count = 3;
  double rate = 0.25;
  std::string mode = "fast";
  std::vector<std::int64_t> ranks{0, 1};
  std::vector<double> weights{0.5};
  std::vector<std::string> names{"a"};
  std::optional<std::string> dir;
  std::shared_ptr<Loss> loss;
  std::int64_t must = 0;

  static void declare(ConfigFields<Everything>& f) {
    using E = Everything;
    f.field("width", &Shared::width, "from a base").at_least(1);
    f.field("flag", &E::flag, "a bool");
    f.field("count", &E::count, "an int").at_least(0);
    f.field("rate", &E::rate, "a number").greater_than(0).at_most(1);
    f.field("mode", &E::mode, "a string").one_of({"fast", "slow"});
    f.field("ranks", &E::ranks, "ints");
    f.field("weights", &E::weights, "numbers");
    f.field("names", &E::names, "strings");
    f.field("dir", &E::dir, "may be left out");
    f.field("loss", &E::loss, "a component").optional();
    f.field("must", &E::must, "no default").required();
    f.check([](const E& e) {
      if (e.count > e.width) throw ConfigError("count must not exceed width", "count");
    });
  }
};

ComponentConfig values(std::map<std::string, Value> v) { return ComponentConfig("components.x", std::move(v), {}); }

TEST(ConfigFields, TheSchemaComesFromTheMembersAndTheirInitialisers) {
  const ConfigFields<Everything> fields = declared_fields<Everything>();
  const Schema& s = fields.schema();
  ASSERT_EQ(s.fields().size(), 11u);
  const std::vector<std::pair<std::string, FieldType>> types = {
      {"width", FieldType::integer},   {"flag", FieldType::boolean},  {"count", FieldType::integer},
      {"rate", FieldType::number},     {"mode", FieldType::string},   {"ranks", FieldType::integers},
      {"weights", FieldType::numbers}, {"names", FieldType::strings}, {"dir", FieldType::string},
      {"loss", FieldType::component},  {"must", FieldType::integer}};
  for (std::size_t i = 0; i < types.size(); ++i) {
    EXPECT_EQ(s.fields()[i].name, types[i].first);
    EXPECT_EQ(s.fields()[i].type, types[i].second) << types[i].first;
  }
  EXPECT_EQ(std::get<std::int64_t>(s.find("width")->default_value), 64);
  EXPECT_EQ(std::get<bool>(s.find("flag")->default_value), true);
  EXPECT_EQ(std::get<double>(s.find("rate")->default_value), 0.25);
  EXPECT_EQ(std::get<std::string>(s.find("mode")->default_value), "fast");
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(s.find("ranks")->default_value), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(s.find("rate")->constraints_text(), "> 0, <= 1");
  EXPECT_EQ(s.find("mode")->choices, (std::vector<std::string>{"fast", "slow"}));
  EXPECT_EQ(s.find("loss")->component_kind, "loss");
  // Optional fields and components have no default and are not required; .required() drops it.
  EXPECT_FALSE(s.find("dir")->has_default());
  EXPECT_FALSE(s.find("dir")->is_required);
  EXPECT_FALSE(s.find("loss")->is_required);
  EXPECT_FALSE(s.find("must")->has_default());
  EXPECT_TRUE(s.find("must")->is_required);
}

TEST(ConfigFields, ReadFillsTheStructFromTheValidatedValues) {
  const ConfigFields<Everything> fields = declared_fields<Everything>();
  const Everything e = fields.read(values({{"width", std::int64_t{8}},
                                           {"flag", false},
                                           {"count", std::int64_t{5}},
                                           {"rate", 0.5},
                                           {"mode", std::string("slow")},
                                           {"ranks", std::vector<std::int64_t>{3}},
                                           {"weights", std::vector<double>{1.0, 2.0}},
                                           {"names", std::vector<std::string>{"x", "y"}},
                                           {"dir", std::string("out")},
                                           {"must", std::int64_t{7}}}));
  EXPECT_EQ(e.width, 8);
  EXPECT_FALSE(e.flag);
  EXPECT_EQ(e.count, 5);
  EXPECT_EQ(e.rate, 0.5);
  EXPECT_EQ(e.mode, "slow");
  EXPECT_EQ(e.ranks, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(e.weights, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(e.names, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(e.dir, std::optional<std::string>("out"));
  EXPECT_EQ(e.loss, nullptr) << "an optional component left out stays null";
  EXPECT_EQ(e.must, 7);
}

TEST(ConfigFields, AnOptionalFieldLeftOutStaysEmpty) {
  const ConfigFields<Everything> fields = declared_fields<Everything>();
  std::map<std::string, Value> v;
  for (const auto& f : fields.schema().fields()) v[f.name] = f.default_value;  // what the host fills in
  v["must"] = std::int64_t{1};
  const Everything e = fields.read(values(v));
  EXPECT_FALSE(e.dir.has_value());
  EXPECT_EQ(e.width, 64);
  EXPECT_EQ(e.mode, "fast");
}

TEST(ConfigFields, RulesRunOnRead) {
  const ConfigFields<Everything> fields = declared_fields<Everything>();
  std::map<std::string, Value> v;
  for (const auto& f : fields.schema().fields()) v[f.name] = f.default_value;
  v["must"] = std::int64_t{1};
  v["count"] = std::int64_t{100};  // above width 64
  try {
    fields.read(values(v));
    FAIL() << "the rule did not run";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "count");
    EXPECT_STREQ(e.what(), "count must not exceed width");
  }
}

struct OptionalWithAValue {
  std::optional<std::int64_t> x = 5;
  static void declare(ConfigFields<OptionalWithAValue>& f) { f.field("x", &OptionalWithAValue::x, "ambiguous"); }
};

TEST(ConfigFields, AnOptionalMemberThatStartsWithAValueIsADeclarationError) {
  // Left out would silently mean 5 while the schema shows no default: refused at registration.
  try {
    declared_fields<OptionalWithAValue>();
    FAIL() << "declared";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config field x: an optional member must start empty"), std::string::npos);
  }
}

TEST(ConfigFields, AComponentWithoutFieldsDeclaresNone) {
  EXPECT_TRUE(declared_fields<NoConfig>().schema().fields().empty());
}


struct Importing {
  std::int64_t width = 64;
  std::int64_t depth = 2;
  std::set<std::string> given;
  static void declare(ConfigFields<Importing>& f) {
    f.field("width", &Importing::width, "a width");
    f.field("depth", &Importing::depth, "a depth");
    f.record_given(&Importing::given);
  }
};

// A model importing a checkpoint must know which fields the YAML wrote: the rest may come from
// the checkpoint's own config.
TEST(ConfigFields, RecordGivenNamesTheFieldsTheYamlWrote) {
  const auto fields = declared_fields<Importing>();
  const Importing read = fields.read(ComponentConfig(
      "components.model", {{"width", Value(std::int64_t{8})}, {"depth", Value(std::int64_t{2})}}, RunContext{}, {"width"}));
  EXPECT_EQ(read.width, 8);
  EXPECT_EQ(read.given, (std::set<std::string>{"width"}));
  EXPECT_TRUE(fields.read(ComponentConfig("m", {{"width", Value(std::int64_t{64})}, {"depth", Value(std::int64_t{2})}},
                                          RunContext{}))
                  .given.empty());
}

}  // namespace config_fields_test
}  // namespace tessera
