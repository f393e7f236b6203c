// The component factory on the real bundled plugins: references, inline nesting, build order,
// cycles, unknown keys and values with their YAML positions.
#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/config/config_file.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "tessera/components/model.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/components/optimizer.hpp"
#include "tessera/components/reward.hpp"
#include "tessera/components/scheduler.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace component_factory_test {

using testing::build_components;
using testing::built;
using testing::validation_error;

const char* kModel =
    "model: {component_key: model, variant_key: gpt, config: {n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 8}}\n";

TEST(ComponentFactory, BuildsReferencesInDependencyOrder) {
  // The optimizer comes first in the file but needs the model: the factory orders the build.
  auto b = build_components(
      "optimizer: {component_key: optimizer, variant_key: adamw,\n"
      "            config: {lr: 0.01, model: {instance_key: model, pass_type: BY_REFERENCE}}}\n" +
      std::string(kModel));
  auto model = built<Model>(b, "model");
  auto optimizer = built<Optimizer>(b, "optimizer");
  ASSERT_TRUE(model && optimizer);
  EXPECT_DOUBLE_EQ(optimizer->base_lr(), 0.01);
  // The optimizer holds the very parameters of the referenced model, not a copy.
  auto params = model->parameters();
  auto opt_params = optimizer->parameters();
  ASSERT_EQ(params.size(), opt_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    bool found = false;
    for (const auto& p : opt_params) found = found || p.is_same(params[i]);
    EXPECT_TRUE(found) << "parameter " << i << " is not the model's";
  }
}

TEST(ComponentFactory, BuildsInlineNestedComponents) {
  auto b = build_components(
      "optimizer:\n"
      "  component_key: optimizer\n"
      "  variant_key: sgd\n"
      "  config:\n"
      "    lr: 0.5\n"
      "    model: {component_key: model, variant_key: gpt, config: {n_layer: 1, n_head: 1, n_embd: 8}}\n");
  EXPECT_DOUBLE_EQ(built<Optimizer>(b, "optimizer")->base_lr(), 0.5);
  EXPECT_FALSE(built<Optimizer>(b, "optimizer")->parameters().empty());
}

TEST(ComponentFactory, BuildsListsOfComponents) {
  auto b = build_components(
      "callbacks:\n"
      "  - {component_key: callback, variant_key: console_logger, config: {every: 5}}\n"
      "  - {component_key: callback, variant_key: jsonl_metrics}\n");
  ASSERT_EQ(b.lists.at("callbacks").size(), 2u);
  EXPECT_EQ(b.lists.at("callbacks")[1].variant, "jsonl_metrics");
}

// A list field (loss/grpo's rewards) takes each item inline or by reference, in order; an item of
// the wrong kind, or a value that is no list, is refused at its position.
TEST(ComponentFactory, ListFieldsTakeInlineAndReferencedComponents) {
  const std::string loss =
      "loss: {component_key: loss, variant_key: grpo, config: {rewards: [\n"
      "  {component_key: reward, variant_key: regex, config: {pattern: 'x'}},\n"
      "  {instance_key: judge, pass_type: BY_REFERENCE}]}}\n";
  auto b = build_components("judge: {component_key: reward, variant_key: math_answer}\n" + loss);
  const RolloutSettings* rollout = built<Loss>(b, "loss")->rollouts();
  ASSERT_NE(rollout, nullptr);
  ASSERT_EQ(rollout->rewards.size(), 2u);
  EXPECT_EQ(rollout->rewards[0].name, "regex");
  EXPECT_EQ(rollout->rewards[1].name, "math_answer");
  EXPECT_EQ(rollout->rewards[1].reward.get(), built<Reward>(b, "judge").get()) << "the referenced component itself";
  const std::string wrong_kind = validation_error(
      "judge: {component_key: loss, variant_key: cross_entropy}\n" + loss);
  EXPECT_NE(wrong_kind.find("expected a component of kind reward, but components.judge is a loss"), std::string::npos)
      << wrong_kind;
  EXPECT_NE(wrong_kind.find("rewards[1]"), std::string::npos) << wrong_kind;
  const std::string not_a_list = validation_error(
      "loss: {component_key: loss, variant_key: grpo, config: {rewards: {component_key: reward, variant_key: regex, "
      "config: {pattern: 'x'}}}}\n");
  EXPECT_NE(not_a_list.find("expected a list of components of kind reward"), std::string::npos) << not_a_list;
}

TEST(ComponentFactory, UnknownConfigKeyHasPositionAndSuggestion) {
  const std::string error = validation_error(
      "sched: {component_key: scheduler, variant_key: warmup_cosine,\n"
      "        config: {total_steps: 10, warmup_step: 2}}\n");
  EXPECT_NE(error.find("test.yaml:2:35: components.sched.config.warmup_step: unknown key (did you mean 'warmup_steps'?)"),
            std::string::npos)
      << error;
}

TEST(ComponentFactory, WrongValueTypeSaysWhatWasExpected) {
  const std::string error = validation_error(
      std::string(kModel) +
      "optimizer: {component_key: optimizer, variant_key: adamw,\n"
      "            config: {lr: fast, model: {instance_key: model}}}\n");
  EXPECT_NE(error.find("test.yaml:3:26: components.optimizer.config.lr: expected a finite number (> 0), got \"fast\""),
            std::string::npos)
      << error;
}

// Infinity (written .inf, or a number past double's range) is no value for any field: durations
// and counts made from it overflow.
TEST(ComponentFactory, NumbersMustBeFinite) {
  for (const std::string lr : {".inf", "1e400"}) {
    const std::string error = validation_error(
        std::string(kModel) + "optimizer: {component_key: optimizer, variant_key: adamw,\n" +
        "            config: {lr: " + lr + ", model: {instance_key: model}}}\n");
    EXPECT_NE(error.find("components.optimizer.config.lr: expected a finite number (> 0), got \"" + lr + "\""), std::string::npos)
        << error;
  }
}

TEST(ComponentFactory, ConstraintViolationIsReported) {
  const std::string error = validation_error(
      "optimizer: {component_key: optimizer, variant_key: adamw, config: {lr: -1, model: {instance_key: m}}}\n"
      "m: {component_key: model, variant_key: gpt}\n");
  EXPECT_NE(error.find("components.optimizer.config.lr: must be > 0, got -1"), std::string::npos) << error;
}

TEST(ComponentFactory, UnknownKindAndVariantSuggestNames) {
  std::string error = validation_error("o: {component_key: optimiser, variant_key: adamw}\n");
  EXPECT_NE(error.find("test.yaml:1:20: components.o.component_key: unknown component kind 'optimiser' (did you mean 'optimizer'?)"),
            std::string::npos)
      << error;
  error = validation_error("o: {component_key: optimizer, variant_key: adamx}\n");
  EXPECT_NE(error.find("components.o.variant_key: no optimizer named 'adamx' (did you mean 'adamw'?)"), std::string::npos)
      << error;
}

TEST(ComponentFactory, DanglingReferenceSuggestsInstance) {
  const std::string error = validation_error(
      std::string(kModel) +
      "optimizer: {component_key: optimizer, variant_key: sgd, config: {model: {instance_key: modle}}}\n");
  EXPECT_NE(error.find("no component named 'modle' under components (did you mean 'model'?)"), std::string::npos)
      << error;
  EXPECT_NE(error.find("test.yaml:2:"), std::string::npos) << error;
}

TEST(ComponentFactory, ReferenceOfTheWrongKindIsAnError) {
  const std::string error = validation_error(
      "loss: {component_key: loss, variant_key: cross_entropy}\n"
      "optimizer: {component_key: optimizer, variant_key: sgd, config: {model: {instance_key: loss}}}\n");
  EXPECT_NE(error.find("expected a component of kind model, but components.loss is a loss"), std::string::npos)
      << error;
}

TEST(ComponentFactory, CyclesAreNamed) {
  const std::string error = validation_error(
      "a: {component_key: optimizer, variant_key: sgd, config: {model: {instance_key: b}}}\n"
      "b: {component_key: optimizer, variant_key: sgd, config: {model: {instance_key: a}}}\n");
  EXPECT_NE(error.find("reference cycle: components.a -> components.b -> components.a"), std::string::npos)
      << error;
}

TEST(ComponentFactory, MissingRequiredFieldIsNamed) {
  const std::string error = validation_error("d: {component_key: dataset, variant_key: tokens, config: {seq_len: 4}}\n");
  EXPECT_NE(error.find("components.d.config.path: required string is missing"), std::string::npos) << error;
}

TEST(ComponentFactory, DeclaredRulesFailValidationAtTheField) {
  // gpt declares that n_embd must be divisible by n_head: `tessera validate` says so, before
  // anything is built.
  const std::string yaml = "model: {component_key: model, variant_key: gpt, config: {n_head: 3, n_embd: 16}}\n";
  EXPECT_NE(validation_error(yaml).find(
                "test.yaml:1:77: components.model.config.n_embd: n_embd (16) must be divisible by n_head (3)"),
            std::string::npos)
      << validation_error(yaml);
  // Rules across nested parts too: a scheduler whose warmup outlasts it.
  const std::string schedule =
      "scheduler: {component_key: scheduler, variant_key: linear, config: {warmup_steps: 9, total_steps: 4}}\n";
  EXPECT_NE(validation_error(schedule).find("components.scheduler.config.warmup_steps: warmup_steps (9) must not exceed"),
            std::string::npos)
      << validation_error(schedule);
}

TEST(ComponentFactory, FactoryErrorsPointAtTheField) {
  testing::TempDir dir;
  // An empty token file: validation looks at the file's size already.
  std::ofstream(dir.file("empty.bin")).flush();
  const std::string empty = "train_data: {component_key: dataset, variant_key: tokens, config: {seq_len: 4, path: " +
                            dir.file("empty.bin") + "}}\n";
  EXPECT_NE(validation_error(empty).find("test.yaml:1:86: components.train_data.config.path: "), std::string::npos)
      << validation_error(empty);
  EXPECT_NE(validation_error(empty).find("empty.bin is empty"), std::string::npos) << validation_error(empty);
  // document_mask without an end-of-document id: only building the dataset (which looks for
  // the file's index) can tell; the factory's error still points at the config.
  const std::string tokens = dir.write("tokens.bin", std::string(64, 'a'));
  const std::string yaml = "train_data: {component_key: dataset, variant_key: tokens, config: {seq_len: 4, path: " +
                           tokens + ", document_mask: true}}\n";
  EXPECT_EQ(validation_error(yaml), "");
  try {
    build_components(yaml);
    FAIL() << "expected a ConfigIssue";
  } catch (const ConfigIssue& e) {
    EXPECT_NE(std::string(e.what()).find("test.yaml:1:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("components.train_data.config.eos_id: document_mask needs the id that ends a "
                                         "document"),
              std::string::npos)
        << e.what();
  }
}

TEST(ComponentFactory, BuiltObjectsKeepTheirPluginLoaded) {
  std::shared_ptr<Scheduler> scheduler;
  {
    // A private host whose registry and libraries go away before the object is used.
    auto host = std::make_unique<PluginHost>();
    host->load_directories({testing::plugin_dir()});
    auto node = parse_config_string(
        "s: {component_key: scheduler, variant_key: warmup_cosine, config: {warmup_steps: 2, total_steps: 10}}\n",
        "t.yaml");
    auto b = ComponentFactory(host->registry(), RunContext{}).build(node);
    scheduler = built<Scheduler>(b, "s");
    host.reset();
  }
  // Calls into the plugin's code: would crash if the library had been unloaded with the host.
  EXPECT_DOUBLE_EQ(scheduler->lr_factor(0), 0.5);
  EXPECT_DOUBLE_EQ(scheduler->lr_factor(1), 1.0);
  scheduler.reset();  // the library is released here, after the object
}

}  // namespace component_factory_test
}  // namespace tessera::core
