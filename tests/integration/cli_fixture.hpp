// The fixture of the command-line tests: a real token file of English text, the path of the
// built `tessera`, the tiny run spec, and reading a run's metrics.jsonl.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tessera {

using testing::run_command;
using testing::TempDir;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    // Real English text (Debian's GPL-3 text, or this test's own source) as byte tokens.
    std::ifstream src(std::ifstream("/usr/share/common-licenses/GPL-3") ? "/usr/share/common-licenses/GPL-3"
                                                                         : __FILE__);
    std::stringstream text;
    text << src.rdbuf();
    ASSERT_FALSE(text.str().empty());
    std::vector<std::uint16_t> tokens;
    while (tokens.size() < 60000) {
      for (unsigned char c : text.str()) tokens.push_back(c);
    }
    data_ = dir_.file("train.bin");
    testing::write_token_file(data_, tokens);
  }

  std::string tessera(const std::string& args) const { return testing::tessera_binary() + " " + args; }
  std::string tiny() const { return testing::source_dir() + "/tests/integration/configs/tiny.yaml"; }
  std::string data_set() const { return " --set components.train_data.config.path=" + data_; }

  // A shell script that starts `tessera launch` of two ranks training without end in the
  // background (`prefix` before the command, e.g. setsid; its output to `output`), keeps the
  // launcher's pid in $p, waits until three steps are in RUN_DIR/metrics.jsonl, then runs `then`.
  std::string endless_launch_then(const std::string& prefix, const std::string& run_dir, const std::string& extra,
                                  const std::string& output, const std::string& then) const {
    const std::string metrics = run_dir + "/metrics.jsonl";
    return prefix + tessera("launch --nproc-per-node 2 -- train " + tiny() + data_set() +
                            " --set trainer.max_steps=100000 " + extra + " --run-dir " + run_dir) +
           " > " + output + " 2>&1 & p=$!; for i in $(seq 600); do [ -f " + metrics + " ] && [ $(wc -l < " +
           metrics + ") -ge 3 ] && break; sleep 0.1; done; " + then;
  }

  TempDir dir_;
  std::string data_;
};

// The per-step lines of a metrics.jsonl (evaluation lines, marked "eval", are left out).
inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (!row.contains("eval")) rows.push_back(std::move(row));
  }
  return rows;
}

// Per-step losses of a run's metrics.jsonl.
inline std::vector<double> step_losses(const std::string& metrics) {
  std::vector<double> losses;
  for (const auto& row : read_metrics(metrics)) losses.push_back(row.at("loss").get<double>());
  return losses;
}

// `tessera plan --json`'s output (`plan_json`) for the mesh a run used (the one marked spec_mesh)
// agrees with what the run's metrics.jsonl measured, within 10 %: the bytes held at step 1
// (parameters, optimizer state, gradients) and moved at step 2 (communicated_bytes*, per group).
inline void expect_plan_agrees_with_metrics(const std::string& plan_json, const std::vector<nlohmann::json>& metrics) {
  const nlohmann::json plan = nlohmann::json::parse(plan_json);
  const nlohmann::json* mesh = nullptr;
  for (const auto& m : plan["meshes"]) {
    if (m["spec_mesh"]) mesh = &m;
  }
  ASSERT_NE(mesh, nullptr) << "the run's mesh is among the planned ones: " << plan_json;
  ASSERT_GE(metrics.size(), 2u);
  const nlohmann::json& first = metrics[0];
  const nlohmann::json& second = metrics[1];
  auto agrees = [](const char* what, double planned, double measured) {
    EXPECT_NEAR(planned, measured, 0.1 * measured) << what << ": planned " << planned << ", measured " << measured;
  };
  // A run keeps a loss's reference copy (loss/dpo without adapters) beside its parameters.
  const nlohmann::json& largest = (*mesh)["largest"];
  agrees("parameter_bytes", largest["parameter_bytes"].get<double>() + largest.value("reference_bytes", 0.0),
         first["parameter_bytes"]);
  agrees("optimizer_bytes", largest["optimizer_bytes"], first["optimizer_bytes"]);
  if ((*mesh)["strategy"] != "local") agrees("gradient_bytes", (*mesh)["largest"]["gradient_bytes"], first["gradient_bytes"]);
  const nlohmann::json& rank0 = (*mesh)["ranks"][0];
  std::size_t groups = 0;
  for (const auto& [key, value] : second.items()) {
    if (key.rfind("communicated_bytes", 0) != 0) continue;
    ++groups;
    ASSERT_TRUE(rank0.contains(key)) << key << " was measured but not planned: " << rank0.dump();
    agrees(key.c_str(), rank0[key], value);
  }
  EXPECT_GE(groups, 1u) << "a mesh of several ranks moves bytes";
}

// The evaluation lines of a metrics.jsonl.
inline std::vector<nlohmann::json> read_eval_metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("eval")) rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace tessera
