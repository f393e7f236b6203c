// `tessera plan`: the meshes a spec can run on over N ranks, each checked as `tessera validate`
// checks a spec, the refused ones with validate's reason, marked against a device memory and
// ranked. (That the planned bytes are the measured ones is checked where the meshes train:
// Meshes.TrainAsOneRankWithAsMuchAccumulation, mesh_fixture.hpp's plan_agrees_with_run.)
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include "mesh_fixture.hpp"

namespace tessera {
namespace plan_test {

class Plan : public TensorParallel {
 protected:
  // `tessera plan ... --json` into `result` (its stderr shown if it fails).
  void plan(const std::string& model, const std::string& args, nlohmann::json& result) {
    std::string out;
    const std::string errors = dir_.file("plan_stderr.txt");
    ASSERT_EQ(run_command(tessera("plan " + config(model) + data_set() + " " + args + " --json 2>" + errors), out), 0)
        << out << std::ifstream(errors).rdbuf();
    result = nlohmann::json::parse(out);
  }
};

TEST_F(Plan, ListsEveryValidMeshOfTheRanksAndRefusesTheRestWithValidatesReason) {
  // tiny_tp: 4 heads, 2 blocks, grad_accum 2.
  nlohmann::json p;
  ASSERT_NO_FATAL_FAILURE(plan("tiny_tp", "--ranks 4", p));
  std::set<std::string> names;
  for (const auto& m : p["meshes"]) {
    const auto& d = m["mesh"];
    EXPECT_EQ(int(d["pp"]) * int(d["dp_replicate"]) * int(d["dp_shard"]) * int(d["cp"]) * int(d["tp"]), 4) << m.dump();
    EXPECT_EQ(m["ranks"].size(), std::size_t(d["pp"])) << "one planned rank per pipeline stage";
    names.insert(m["name"]);
  }
  for (const char* expected : {"dp_shard 4", "tp 4", "dp_shard 2 x tp 2", "pp 2 x dp_shard 2 (1f1b)", "cp 2 x tp 2 (ring)",
                               "dp_shard 2 x tp 2 with sequence parallelism"}) {
    EXPECT_TRUE(names.count(expected)) << expected << " in " << p["meshes"].dump();
  }
  // Four stages of two blocks, or four ranks' worth of micro-batches from grad_accum 2: refused.
  bool pp4_refused = false;
  for (const auto& line : p["refused"]) {
    const std::string text = line;
    if (text.rfind("pp 4:", 0) == 0) {
      pp4_refused = true;
      EXPECT_NE(text.find("tiny_tp.yaml:"), std::string::npos) << "positioned as validate positions it: " << text;
    }
  }
  EXPECT_TRUE(pp4_refused) << p["refused"].dump();
  // Without a mixture of experts no ep; fsdp is not the spec's strategy: no hybrid sharding.
  for (const auto& m : p["meshes"]) {
    EXPECT_EQ(m["mesh"]["ep"], 1);
    EXPECT_EQ(m["mesh"]["dp_replicate"], 1);
  }
  // An MoE model under fsdp adds the expert-parallel and hybrid-sharded meshes.
  nlohmann::json moe;
  ASSERT_NO_FATAL_FAILURE(plan("tiny_moe_ep", "--ranks 4" + kFsdp, moe));
  bool ep = false, hybrid = false;
  for (const auto& m : moe["meshes"]) {
    ep = ep || m["mesh"]["ep"] > 1;
    hybrid = hybrid || m["mesh"]["dp_replicate"] > 1;
  }
  EXPECT_TRUE(ep && hybrid) << moe["meshes"].dump();
}

// GPT-2's published vocabulary (50257, odd) does not keep tensor parallelism out: on 8 ranks the
// plan lists tp meshes (the embedding padded on each rank) and refuses none for its vocabulary.
TEST_F(Plan, Gpt2sOddVocabularyPlansTensorParallelMeshes) {
  std::string out;
  const std::string errors = dir_.file("plan_stderr.txt");
  ASSERT_EQ(run_command(tessera("plan " + testing::source_dir() + "/configs/gpt2-124m.yaml --ranks 8 --set 'plugins.paths=[" +
                                testing::plugin_dir() + "]' --json 2>" + errors),
                        out),
            0)
      << out << std::ifstream(errors).rdbuf();
  const nlohmann::json p = nlohmann::json::parse(out);
  std::set<std::string> names;
  for (const auto& m : p["meshes"]) names.insert(m["name"]);
  for (const char* expected : {"dp_shard 4 x tp 2", "dp_shard 2 x tp 4", "pp 2 x tp 4 (1f1b)"}) {
    EXPECT_TRUE(names.count(expected)) << expected << " in " << p["meshes"].dump();
  }
  for (const auto& line : p["refused"]) EXPECT_EQ(line.get<std::string>().find("vocab_size"), std::string::npos) << line;
}

TEST_F(Plan, MarksWhatFitsTheDeviceMemoryAndRanksTheFittingFirst) {
  // Between the smallest and the largest rank's total: some meshes fit, some do not.
  nlohmann::json all;
  ASSERT_NO_FATAL_FAILURE(plan("tiny_tp", "--ranks 4", all));
  double least = 1e30, most = 0;
  for (const auto& m : all["meshes"]) {
    least = std::min(least, double(m["largest"]["total_bytes"]));
    most = std::max(most, double(m["largest"]["total_bytes"]));
  }
  ASSERT_LT(least, most);
  const double gib = (least + most) / 2 / (1024.0 * 1024 * 1024);
  nlohmann::json p;
  ASSERT_NO_FATAL_FAILURE(plan("tiny_tp", "--ranks 4 --device-memory " + std::to_string(gib), p));
  bool seen_unfitting = false, some_fit = false;
  std::tuple<double, double> previous{-1, -1};
  for (const auto& m : p["meshes"]) {
    const bool fits = m["fits"];
    EXPECT_EQ(fits, double(m["largest"]["total_bytes"]) <= double(p["device_memory_bytes"])) << m.dump();
    EXPECT_FALSE(fits && seen_unfitting) << "fitting meshes first";
    if (!fits && !seen_unfitting) previous = {-1, -1};
    seen_unfitting = seen_unfitting || !fits;
    some_fit = some_fit || fits;
    // Within each part: the smaller bubble first, then fewer bytes moved.
    const std::tuple<double, double> key{m["bubble"], m["largest"]["communicated_bytes"]};
    EXPECT_LE(previous, key) << m.dump();
    previous = key;
  }
  EXPECT_TRUE(some_fit && seen_unfitting);
}

TEST_F(Plan, PrintsATableAndRefusesABadCommandLine) {
  std::string out;
  ASSERT_EQ(run_command(tessera("plan " + config("tiny_tp") + data_set() + " --ranks 2 --set parallelism.tp=2"), out), 0)
      << out;
  EXPECT_NE(out.find("model/gpt on 2 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("*tp 2"), std::string::npos) << "the spec's own mesh is marked: " << out;
  EXPECT_NE(out.find("bubble"), std::string::npos) << out;
  EXPECT_EQ(run_command(tessera("plan " + config("tiny_tp") + data_set()), out), 2) << "--ranks is required: " << out;
  EXPECT_EQ(run_command(tessera("plan " + config("tiny_tp") + data_set() + " --ranks 0"), out), 2) << out;
  EXPECT_NE(out.find("--ranks must be at least 1"), std::string::npos) << out;
}

}  // namespace plan_test
}  // namespace tessera
