// Model exports: RUN_DIR/exports/step_N/{model.safetensors, config.json} read back by Python's
// torch + safetensors (an independent forward pass must give Tessera's logits), and model/gpt
// initialised from an export gives the exported model's logits exactly.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tessera/core/checkpoint/checkpoint_settings.hpp"
#include "tessera/core/checkpoint/checkpoint_writer.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/components/model.hpp"
#include "tessera/formats/safetensors.hpp"
#include "small_trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace model_export_test {

using testing::TempDir;
namespace fs = std::filesystem;

const char* kGpt = "model: {component_key: model, variant_key: gpt,\n"
                   "        config: {vocab_size: 40, n_layer: 2, n_head: 2, n_embd: 16, max_seq_len: 12";

std::string exported_model(const TempDir& dir, at::Tensor& logits, const at::Tensor& input) {
  core::seed_everything(3, "cpu");
  auto built = testing::build_components(std::string(kGpt) + "}}\n");
  auto model = testing::built<Model>(built, "model");
  {
    c10::NoGradGuard no_grad;
    logits = model->forward(input);
  }
  core::CheckpointState state;
  state.step = 7;
  for (const auto& item : model->named_parameters()) state.model[item.key()] = item.value().detach().clone();
  state.model_config_json =
      R"({"component_key": "model", "variant_key": "gpt", "config": {"vocab_size": 40, "n_layer": 2, "n_head": 2, "n_embd": 16, "max_seq_len": 12}})";
  core::write_model_export(core::CheckpointStore(dir.file("checkpoints"), dir.file("exports")), state, 5000000000ULL);
  return dir.file("exports") + "/step_00000007";
}

TEST(ModelExport, PythonTorchAndSafetensorsGiveTesserasLogits) {
  const std::string python = testing::source_dir() + "/.venv/bin/python3";
  std::string out;
  if (testing::run_command(python + " -c 'import torch, safetensors'", out) != 0) {
    GTEST_SKIP() << "no Python with torch and safetensors in .venv (tools/setup.sh installs them): " << out;
  }
  TempDir dir;
  const at::Tensor input = at::tensor({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4}, at::kLong).view({2, 10});
  at::Tensor logits;
  const std::string exported = exported_model(dir, logits, input);
  ASSERT_TRUE(std::filesystem::exists(exported + "/model.safetensors"));
  ASSERT_TRUE(std::filesystem::exists(exported + "/config.json"));
  write_safetensors(dir.file("logits.safetensors"), {{"input_ids", input}, {"logits", logits}});
  const int rc = testing::run_command(python + " " + testing::source_dir() + "/tools/interop/gpt_from_export.py " +
                                          exported + " --check " + dir.file("logits.safetensors"),
                                      out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("max |logits - Tessera's| = "), std::string::npos) << out;
}

TEST(ModelExport, GptInitialisesFromAnExport) {
  TempDir dir;
  const at::Tensor input = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({1, 6});
  at::Tensor logits;
  const std::string exported = exported_model(dir, logits, input);
  core::seed_everything(99, "cpu");  // other initial weights, replaced by the export's
  auto built = testing::build_components(std::string(kGpt) + ", init_from: " + exported + "}}\n");
  c10::NoGradGuard no_grad;
  EXPECT_TRUE(testing::built<Model>(built, "model")->forward(input).equal(logits));

  try {
    testing::build_components(
        "model: {component_key: model, variant_key: gpt, config: {vocab_size: 40, n_layer: 3, n_head: 2, n_embd: 16, "
        "max_seq_len: 12, init_from: " + exported + "}}\n");
    ADD_FAILURE() << "expected an error for a model with another shape";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the YAML says n_layer: 3 but " + exported + "/config.json says n_layer: 2"),
              std::string::npos)
        << e.what();
  }
}

// model/VARIANT (gpt unless said) with `fields` (YAML, each followed by ", ") and init_from `exported`.
core::BuiltComponents model_from(const std::string& exported, const std::string& fields = "",
                               const std::string& variant = "gpt") {
  return testing::build_components("model: {component_key: model, variant_key: " + variant + ", config: {" + fields +
                                   "init_from: " + exported + "}}\n");
}

// The error building model_from(...) gives; "" when it builds.
std::string refusal(const std::string& exported, const std::string& fields, const std::string& variant = "gpt") {
  try {
    model_from(exported, fields, variant);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The export's config.json settles what the YAML leaves out, as a Hugging Face folder's does: its
// 2 heads split the [16, 16] projections, which would load as well into the default 4 heads.
TEST(ModelExport, TheExportsConfigSettlesWhatTheYamlLeavesOut) {
  TempDir dir;
  const at::Tensor input = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({1, 6});
  at::Tensor logits;
  const std::string exported = exported_model(dir, logits, input);
  {
    auto built = model_from(exported);
    c10::NoGradGuard no_grad;
    EXPECT_TRUE(testing::built<Model>(built, "model")->forward(input).equal(logits));
  }
  const std::string heads = refusal(exported, "n_head: 4, ");
  EXPECT_NE(heads.find("the YAML says n_head: 4 but " + exported + "/config.json says n_head: 2"), std::string::npos)
      << heads;
  // A field the export's YAML left out had its default: a YAML saying otherwise is told so.
  const std::string activation = refusal(exported, "activation: gelu_tanh, ");
  EXPECT_NE(activation.find("config.json says activation: left out, so the default ('gelu')"), std::string::npos)
      << activation;
  const std::string variant = refusal(exported, "", "llama");
  EXPECT_NE(variant.find("describes model/gpt, not model/llama"), std::string::npos) << variant;
}

// An export records the architecture its model was built with, not only what its YAML wrote:
// a run that took its architecture from init_from exports a folder that init_from of a later
// run can settle against. An export written before (the YAML's fields, one of them init_from)
// settles what it has and leaves the rest to the YAML.
TEST(ModelExport, AnExportRecordsTheArchitectureItsModelWasBuiltWith) {
  TempDir dir;
  const at::Tensor input = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({1, 6});
  at::Tensor logits;
  const std::string exported = exported_model(dir, logits, input);
  auto built = model_from(exported);
  auto model = testing::built<Model>(built, "model");
  const auto spec = nlohmann::json::parse(core::export_config_json(
      R"({"component_key": "model", "variant_key": "gpt", "config": {"init_from": ")" + exported + R"("}})",
      model->architecture_json()));
  EXPECT_EQ(spec["config"]["init_from"], exported);
  EXPECT_EQ(spec["config"]["n_head"], 2);
  EXPECT_EQ(spec["config"]["vocab_size"], 40);
  EXPECT_EQ(spec["config"]["max_seq_len"], 12);
  EXPECT_EQ(spec["config"]["activation"], "gelu");

  // The older form: the YAML's fields alone, as that run's YAML reader read them.
  const std::string old_form = dir.file("old_export");
  fs::create_directories(old_form);
  fs::copy_file(exported + "/model.safetensors", old_form + "/model.safetensors");
  std::ofstream(old_form + "/config.json")
      << R"({"component_key": "model", "variant_key": "gpt", "config": {"init_from": "/elsewhere", "vocab_size": 40.0, "bias": "True"}})";
  auto again = testing::build_components(std::string(kGpt) + ", init_from: " + old_form + "}}\n");
  c10::NoGradGuard no_grad;
  EXPECT_TRUE(testing::built<Model>(again, "model")->forward(input).equal(logits));
}

// The trainer writes exports with the config completed: the spec's model section (here only an
// init_from, as a run taking its architecture from elsewhere writes it) and every field the model
// was built with.
TEST(ModelExport, TheTrainersExportsRecordTheBuiltArchitecture) {
  TempDir dir;
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir)), testing::settings(1, 2, 1));
  core::CheckpointContext checkpoints;
  checkpoints.settings.at_end = false;
  checkpoints.settings.export_at_end = true;
  checkpoints.store = core::CheckpointStore(dir.file("checkpoints"), dir.file("exports"));
  checkpoints.model_config_json = R"({"component_key": "model", "variant_key": "gpt", "config": {"init_from": "/elsewhere"}})";
  run.trainer->enable_checkpoints(checkpoints);
  run.trainer->fit();
  std::ifstream in(dir.file("exports/step_00000001/config.json"));
  ASSERT_TRUE(in) << "no export written";
  const auto written = nlohmann::json::parse(in);
  EXPECT_EQ(written["config"]["init_from"], "/elsewhere");
  const auto built = nlohmann::json::parse(run.trainer->model().architecture_json());  // items() refers to it
  for (const auto& [key, value] : built.items()) {
    EXPECT_EQ(written["config"][key], value) << key;
  }
  EXPECT_TRUE(written["config"].contains("n_head"));
}

}  // namespace model_export_test
}  // namespace tessera
