// Runs the real build/bin/tessera on real YAML and checks what a user sees: exit codes, one-line
// errors with positions, the files a run writes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>
#include <unistd.h>

#include "cli_fixture.hpp"
#include "gloo_ranks.hpp"
#include "tessera/version.hpp"

namespace tessera {
namespace cli_test {

TEST_F(Cli, VersionAndHelp) {
  std::string out;
  EXPECT_EQ(run_command(tessera("--version"), out), 0);
  EXPECT_NE(out.find("tessera 0.1.0"), std::string::npos);
  // What plugins must be built with: the host's build record.
  EXPECT_NE(out.find(std::string("(SDK ABI ") + std::to_string(kSdkAbiVersion) + "; LibTorch " + TORCH_VERSION + ", "),
            std::string::npos)
      << out;
  for (const char* cmd : {"train", "validate", "components", "describe", "plan"}) {
    EXPECT_EQ(run_command(tessera(std::string(cmd) + " --help"), out), 0) << cmd;
    EXPECT_NE(out.find("usage: tessera"), std::string::npos) << cmd;
  }
  EXPECT_EQ(run_command(tessera("frobnicate"), out), 2);
  EXPECT_EQ(run_command(tessera("train"), out), 2);
  EXPECT_NE(out.find("missing CONFIG"), std::string::npos) << out;
  EXPECT_EQ(run_command(tessera("train x.yaml --no-such-flag"), out), 2);
}

TEST_F(Cli, ComponentsListsEveryPluginFromItsFile) {
  std::string out;
  ASSERT_EQ(run_command(tessera("components"), out), 0) << out;
  for (const char* name : {"model/gpt", "dataset/tokens", "loss/cross_entropy", "optimizer/adamw", "optimizer/sgd",
                           "scheduler/constant", "scheduler/warmup_cosine", "scheduler/linear",
                           "callback/console_logger", "callback/jsonl_metrics", "callback/sample_text",
                           "tokenizer/bytes"}) {
    EXPECT_NE(out.find(name), std::string::npos) << name;
  }
  EXPECT_NE(out.find("libtessera_optimizer_sgd.so"), std::string::npos);
  ASSERT_EQ(run_command(tessera("components --kind scheduler"), out), 0);
  EXPECT_EQ(out.find("model/gpt"), std::string::npos);
  EXPECT_EQ(run_command(tessera("components --kind shceduler"), out), 2);
  EXPECT_NE(out.find("did you mean 'scheduler'"), std::string::npos) << out;
}

TEST_F(Cli, DescribeShowsTheSchema) {
  std::string out;
  ASSERT_EQ(run_command(tessera("describe optimizer/adamw"), out), 0) << out;
  EXPECT_NE(out.find("lr (float) = 0.001 [> 0]"), std::string::npos) << out;
  EXPECT_NE(out.find("model (component) required [kind model]"), std::string::npos) << out;
  EXPECT_EQ(run_command(tessera("describe optimizer/adamx"), out), 2);
  EXPECT_NE(out.find("did you mean 'optimizer/adamw'"), std::string::npos) << out;
}

TEST_F(Cli, ComponentsJsonCarriesEverySchema) {
  std::string out;
  ASSERT_EQ(run_command(tessera("components --json --kind optimizer") + " 2>/dev/null", out), 0) << out;
  const auto list = nlohmann::json::parse(out);
  std::vector<std::string> variants;
  for (const auto& component : list) variants.push_back(component["variant"]);
  std::sort(variants.begin(), variants.end());
  ASSERT_EQ(variants, (std::vector<std::string>{"adamw", "muon", "sgd"}));
  const auto& adamw = *std::find_if(list.begin(), list.end(), [](const auto& c) { return c["variant"] == "adamw"; });
  EXPECT_NE(adamw["plugin"].get<std::string>().find("libtessera_optimizer_adamw.so"), std::string::npos);
  bool saw_lr = false;
  for (const auto& f : adamw["fields"]) {
    if (f["name"] == "lr") {
      saw_lr = true;
      EXPECT_EQ(f["type"], "float");
      EXPECT_EQ(f["default"], 0.001);
      EXPECT_EQ(f["greater_than"], 0.0);
      EXPECT_FALSE(f["doc"].get<std::string>().empty());
    }
  }
  EXPECT_TRUE(saw_lr);
}

TEST_F(Cli, SchemaIsAJsonSchemaOfTheWholeRunSpec) {
  std::string out;
  ASSERT_EQ(run_command(tessera("schema") + " 2>/dev/null", out), 0) << out;
  const auto schema = nlohmann::json::parse(out);
  EXPECT_EQ(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
  const auto& defs = schema["$defs"];
  const auto& adamw = defs["component_optimizer_adamw"];
  EXPECT_EQ(adamw["properties"]["variant_key"]["const"], "adamw");
  EXPECT_EQ(adamw["properties"]["config"]["additionalProperties"], false);
  EXPECT_EQ(adamw["properties"]["config"]["required"], nlohmann::json({"model"}));
  EXPECT_EQ(adamw["properties"]["config"]["properties"]["model"]["$ref"], "#/$defs/kind_model");
  EXPECT_TRUE(defs.contains("kind_scheduler"));
  EXPECT_EQ(schema["properties"]["components"]["properties"]["optimizer"]["$ref"], "#/$defs/kind_optimizer");
  EXPECT_TRUE(schema["properties"]["trainer"]["properties"].contains("grad_accum"));
}

TEST_F(Cli, FactoryExceptionExitsTwoWithTheComponentPath) {
  std::string out;
  // gpt throws from its factory (n_embd not divisible by n_head): one line, exit 2, no crash.
  EXPECT_EQ(run_command(tessera("train " + tiny() + data_set() + " --set components.model.config.n_head=3" +
                                " --run-dir " + dir_.file("x")), out), 2)
      << out;
  EXPECT_NE(out.find("components.model.config.n_embd: n_embd (32) must be divisible by n_head (3)"),
            std::string::npos)
      << out;
}

TEST_F(Cli, NewPluginRefusesUnknownKindsAndTakenNames) {
  std::string out;
  EXPECT_EQ(run_command(tessera("new-plugin schedular x --dir " + dir_.path().string()), out), 2);
  EXPECT_NE(out.find("did you mean 'scheduler'"), std::string::npos) << out;
  EXPECT_EQ(run_command(tessera("new-plugin scheduler constant --dir " + dir_.path().string()), out), 2);
  EXPECT_NE(out.find("already registered"), std::string::npos) << out;
  ASSERT_EQ(run_command(tessera("new-plugin loss my_loss --dir " + dir_.path().string()), out), 0) << out;
  for (const char* f : {"my_loss.cpp", "CMakeLists.txt", "README.md", "my_loss_test.yaml"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_.path() / "my_loss" / f)) << f;
  }
  EXPECT_EQ(run_command(tessera("new-plugin loss my_loss --dir " + dir_.path().string()), out), 2);
  EXPECT_NE(out.find("already exists"), std::string::npos) << out;
}

TEST_F(Cli, ValidateAcceptsAGoodSpecAndRejectsMistakesWithPositions) {
  std::string out;
  EXPECT_EQ(run_command(tessera("validate " + tiny() + data_set()), out), 0) << out;
  EXPECT_EQ(run_command(tessera("validate " + tiny() + data_set() + " --set components.optimizer.config.lr=fast"),
                        out), 2);
  EXPECT_NE(out.find("components.optimizer.config.lr: expected a finite number (> 0), got \"fast\""), std::string::npos)
      << out;

  const std::string bad = dir_.write("bad.yaml",
                                     "include: " + tiny() + "\n"
                                     "trainer: {max_stpes: 3}\n");
  EXPECT_EQ(run_command(tessera("validate " + bad), out), 2);
  EXPECT_NE(out.find(bad + ":2:11: trainer.max_stpes: unknown key (did you mean 'max_steps'?)"), std::string::npos)
      << out;
  const std::string missing = dir_.write("missing.yaml",
                                         "include: " + tiny() + "\n"
                                         "components:\n"
                                         "  train_data:\n"
                                         "    config: {path: /nonexistent.bin}\n");
  EXPECT_EQ(run_command(tessera("train " + missing + " --run-dir " + dir_.file("r")), out), 2);
  // The factory's complaint points at the value in the file that set it.
  EXPECT_NE(out.find(missing + ":4:20: components.train_data.config.path: "), std::string::npos) << out;
}

TEST_F(Cli, TrainWritesMetricsAndResolvedConfigAndLossFalls) {
  std::string out;
  const std::string run_dir = dir_.file("run");
  ASSERT_EQ(run_command(tessera("train " + tiny() + data_set() + " --run-dir " + run_dir), out), 0) << out;
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(metrics, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 40u);
  for (const char* key : {"step", "loss", "grad_norm", "lr", "tokens", "tokens_per_s", "step_time_s"}) {
    EXPECT_TRUE(lines[0].contains(key)) << key;
  }
  EXPECT_EQ(lines.back()["step"], 40);
  EXPECT_EQ(lines.back()["tokens"], 40 * 2 * 8 * 32);
  EXPECT_LT(lines.back()["loss"].get<double>(), lines.front()["loss"].get<double>() - 1.0);
  std::ifstream resolved(run_dir + "/config.yaml");
  std::stringstream text;
  text << resolved.rdbuf();
  EXPECT_NE(text.str().find("total_steps: 40"), std::string::npos) << "interpolation resolved in the saved config";
  EXPECT_NE(text.str().find(data_), std::string::npos) << "--set applied in the saved config";
}

TEST_F(Cli, SwappingOptimizerAndSchedulerNeedsOnlyYaml) {
  std::string out;
  const std::string swap = " --set components.optimizer.variant_key=sgd --set components.optimizer.config.lr=0.1"
                           " --set components.scheduler.variant_key=linear --set trainer.max_steps=6";
  ASSERT_EQ(run_command(tessera("train " + tiny() + data_set() + swap + " --run-dir " + dir_.file("s")), out), 0)
      << out;
  std::ifstream resolved(dir_.file("s") + "/config.yaml");
  std::stringstream text;
  text << resolved.rdbuf();
  EXPECT_NE(text.str().find("variant_key: sgd"), std::string::npos);
  EXPECT_NE(text.str().find("variant_key: linear"), std::string::npos);
}

TEST_F(Cli, RuntimeFailureExitsWithOne) {
  std::string out;
  // A sequence longer than the model's context fails inside the loop, not in the config.
  EXPECT_EQ(run_command(tessera("train " + tiny() + data_set() + " --set components.train_data.config.seq_len=64" +
                                " --run-dir " + dir_.file("f")), out), 1)
      << out;
  EXPECT_NE(out.find("error: "), std::string::npos) << out;
}

TEST_F(Cli, SigtermStopsAfterTheCurrentStep) {
  const std::string run_dir = dir_.file("sig");
  const std::string metrics = run_dir + "/metrics.jsonl";
  // Start a long run, wait for three steps, send SIGTERM, and collect its exit code.
  const std::string script =
      tessera("train " + tiny() + data_set() + " --set trainer.max_steps=100000 --run-dir " + run_dir) + " > " +
      dir_.file("sig.log") + " 2>&1 & p=$!; for i in $(seq 600); do [ -f " + metrics + " ] && [ $(wc -l < " +
      metrics + ") -ge 3 ] && break; sleep 0.1; done; kill -TERM $p; wait $p; echo rc=$?";
  std::string out;
  ASSERT_EQ(run_command("sh -c '" + script + "'", out), 0) << out;
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
  std::ifstream log(dir_.file("sig.log"));
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("received SIGTERM"), std::string::npos) << text.str();
  EXPECT_EQ(text.str().find("error"), std::string::npos) << text.str();
}

TEST_F(Cli, TwoRanksOnGlooMatchOneRankWithTwiceTheAccumulation) {
  std::string out;
  const std::string common = data_set() + " --set trainer.max_steps=5 --set trainer.micro_batch_size=4";
  ASSERT_EQ(run_command(tessera("train " + tiny() + common + " --set trainer.grad_accum=2 --run-dir " +
                                dir_.file("one")), out), 0)
      << out;
  // Two processes as torchrun would start them: same command, RANK 0 and 1, one rendezvous.
  const std::string port = std::to_string(testing::free_loopback_port());
  const std::string rank_cmd = tessera("train " + tiny() + common + " --set trainer.grad_accum=1" +
                                       " --set settings.collective_timeout_s=60 --run-dir " + dir_.file("two"));
  const std::string script = "export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + "; RANK=1 " + rank_cmd +
                             " > " + dir_.file("rank1.log") + " 2>&1 & p=$!; RANK=0 " + rank_cmd + " > " +
                             dir_.file("rank0.log") + " 2>&1; r0=$?; wait $p; echo rc=$r0,$?";
  ASSERT_EQ(run_command("sh -c '" + script + "'", out), 0) << out;
  std::string log0, log1;
  run_command("cat " + dir_.file("rank0.log"), log0);
  run_command("cat " + dir_.file("rank1.log"), log1);
  ASSERT_NE(out.find("rc=0,0"), std::string::npos) << out << log0 << log1;
  EXPECT_NE(log1.find("[rank 1]"), std::string::npos) << log1;

  const auto one = read_metrics(dir_.file("one") + "/metrics.jsonl");
  const auto two = read_metrics(dir_.file("two") + "/metrics.jsonl");
  ASSERT_EQ(one.size(), 5u);
  ASSERT_EQ(two.size(), 5u) << "rank 0 alone writes the metrics";
  for (size_t i = 0; i < one.size(); ++i) {
    const double l1 = one[i]["loss"], l2 = two[i]["loss"], g1 = one[i]["grad_norm"], g2 = two[i]["grad_norm"];
    EXPECT_NEAR(l2, l1, 1e-5 * l1) << "step " << i + 1;
    EXPECT_NEAR(g2, g1, 1e-4 * g1) << "step " << i + 1;
    EXPECT_EQ(two[i]["tokens"], one[i]["tokens"]) << "tokens are counted over both ranks";
    EXPECT_EQ(two[i]["target_tokens"], one[i]["target_tokens"]);
    // Two ranks wait for each other's gradients; one rank waits for nothing.
    EXPECT_GT(two[i]["time_communication_s"].get<double>(), 0) << "step " << i + 1;
    EXPECT_LT(two[i]["time_communication_s"].get<double>(), two[i]["step_time_s"].get<double>());
    EXPECT_EQ(one[i]["time_communication_s"].get<double>(), 0) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(two[i]["tokens_per_s_per_device"].get<double>(), two[i]["tokens_per_s"].get<double>() / 2);
  }
}

TEST_F(Cli, ARankWhosePeerNeverComesFailsWithinTheTimeout) {
  std::string out;
  const std::string port = std::to_string(testing::free_loopback_port());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(run_command("WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " +
                            tessera("train " + tiny() + data_set() + " --set settings.collective_timeout_s=3" +
                                    " --run-dir " + dir_.file("alone")),
                        out), 1)
      << out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(120));
  EXPECT_NE(out.find("rendezvous at 127.0.0.1:" + port + " failed"), std::string::npos) << out;
}

// Runs `script` (from endless_launch_then, ending in "wait $p; echo rc=$?" with the launch's
// output in `log_file`): both ranks printed, took `signal_name` as a stop and exited 0.
void expect_ranks_stopped_cleanly(const std::string& script, const std::string& log_file, const char* signal_name) {
  std::string out;
  ASSERT_EQ(run_command("sh -c '" + script + "'", out), 0) << out;
  std::string log;
  run_command("cat " + log_file, log);
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out << log;
  EXPECT_NE(log.find("[rank 0] "), std::string::npos) << log;
  EXPECT_NE(log.find("[rank 1] "), std::string::npos) << log;
  EXPECT_NE(log.find(std::string("received ") + signal_name), std::string::npos) << log;
}

TEST_F(Cli, LaunchStartsRanksPrefixesOutputAndForwardsSigterm) {
  // SIGTERM to the launcher reaches both ranks; they agree on the step to stop after and exit 0.
  const std::string log = dir_.file("launch.log");
  expect_ranks_stopped_cleanly(endless_launch_then("", dir_.file("launched"), "", log, "kill -TERM $p; wait $p; echo rc=$?"),
                               log, "SIGTERM");
}

// Ctrl-C in a terminal signals the whole process group: the launcher and its ranks get SIGINT,
// and the launcher forwards it as well. Each rank takes the two as one request, stops after an
// agreed step and exits 0 (a second signal within two seconds would otherwise kill it).
TEST_F(Cli, LaunchStopsCleanlyWhenTheWholeProcessGroupGetsSigint) {
  // setsid: the launcher leads its own process group, as a terminal's foreground job does.
  const std::string log = dir_.file("launch.log");
  expect_ranks_stopped_cleanly(
      endless_launch_then("setsid ", dir_.file("interrupted"), "", log, "/bin/kill -INT -- -$p; wait $p; echo rc=$?"),
      log, "SIGINT");
}

// A launcher that dies (SIGKILL, the OOM killer) takes its ranks with it: each gets SIGTERM and
// stops, instead of training on unwatched. The ranks print nothing here (no callbacks), so no
// broken pipe would end them either.
TEST_F(Cli, RanksStopWhenTheLauncherIsKilled) {
  const std::string script = endless_launch_then(
      "", dir_.file("orphaned"), "--set components.callbacks=[]", "/dev/null",
      "ranks=$(pgrep -P $p); kill -KILL $p; "
      "for i in $(seq 300); do alive=; for r in $ranks; do "
      "[ -d /proc/$r ] && ! grep -q \"^State:.*Z\" /proc/$r/status 2>/dev/null && alive=\"$alive $r\"; done; "
      "[ -z \"$alive\" ] && break; sleep 0.1; done; echo ranks=[$ranks] alive=[$alive]; "
      "[ -n \"$alive\" ] && kill -KILL $alive; true");
  std::string out;
  ASSERT_EQ(run_command("sh -c '" + script + "'", out), 0) << out;
  EXPECT_EQ(out.find("ranks=[]"), std::string::npos) << "no ranks found: " << out;
  EXPECT_NE(out.find("alive=[]"), std::string::npos) << "ranks outlived the launcher: " << out;
}

TEST_F(Cli, LaunchRefusesOptionsOutOfRangeBeforeStartingRanks) {
  struct Case {
    std::string options, says;
  } cases[] = {
      {"--master-port 70000", "--master-port 70000 is not a port"},
      {"--master-port -1", "--master-port -1 is not a port"},
      {"--grace-s -1", "--grace-s must be between 0 and 3600"},
      {"--grace-s nan", "--grace-s must be between 0 and 3600"},
      {"--nproc-per-node 0", "need --nproc-per-node >= 1"},
  };
  for (const Case& c : cases) {
    std::string out;
    const std::string options = c.options.rfind("--nproc", 0) == 0 ? c.options : "--nproc-per-node 2 " + c.options;
    EXPECT_EQ(run_command(tessera("launch " + options + " -- train " + tiny() + data_set()), out), 2) << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << out;
    EXPECT_EQ(out.find("[rank "), std::string::npos) << "a rank was started: " << out;
  }
}

TEST_F(Cli, LaunchStopsEveryRankWhenOneFails) {
  // Only rank 0's data file exists: rank 1 fails while building, and rank 0 must not hang.
  std::filesystem::copy_file(data_, data_ + "0");
  std::string out;
  const auto start = std::chrono::steady_clock::now();
  const int rc = run_command(tessera("launch --nproc-per-node 2 --grace-s 2 -- train " + tiny() +
                                     " '--set' 'components.train_data.config.path=" + data_ + "${env:RANK}'" +
                                     " --set settings.collective_timeout_s=240 --run-dir " + dir_.file("fail")),
                             out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(120));
  EXPECT_NE(out.find("stopping the other ranks"), std::string::npos) << out;
}

// The bytes one rank logged as held between steps ("memory held by rank R ...: parameters P B,
// gradients G B, optimizer state O B"), per rank.
struct HeldBytes {
  double parameters = -1, gradients = -1, optimizer = -1;
};
std::map<int, HeldBytes> held_bytes(const std::string& log) {
  std::map<int, HeldBytes> out;
  const std::regex line(R"(memory held by rank (\d+) between steps: parameters (\d+) B, gradients (\d+) B, optimizer state (\d+) B)");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
    out[std::stoi((*it)[1])] = {std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])};
  }
  return out;
}

struct LaunchCase {
  std::string strategy;
  int ranks;
};
void PrintTo(const LaunchCase& c, std::ostream* os) { *os << c.strategy << " on " << c.ranks << " ranks"; }

class Launch : public Cli, public ::testing::WithParamInterface<LaunchCase> {};

// Separate processes started by `tessera launch`, one Gloo group: the same per-step loss and
// grad norm as one process with as much accumulation, and the sharding visible in every rank's
// memory report.
TEST_P(Launch, RanksMatchOneProcessWithAsMuchAccumulation) {
  const LaunchCase c = GetParam();
  const std::string common = data_set() + " --set trainer.max_steps=5 --set trainer.micro_batch_size=4" +
                             " --set settings.num_threads=1";
  std::string one_log, log;
  ASSERT_EQ(run_command(tessera("train " + tiny() + common + " --set trainer.grad_accum=" + std::to_string(c.ranks) +
                                " --run-dir " + dir_.file("one")), one_log), 0)
      << one_log;
  const std::string strategy = " --set components.parallel.component_key=parallel --set components.parallel.variant_key=" +
                               c.strategy + (c.strategy == "fsdp" ? "" : " --set components.parallel.config.bucket_mb=0.01");
  ASSERT_EQ(run_command(tessera("launch --nproc-per-node " + std::to_string(c.ranks) + " -- train " + tiny() + common +
                                " --set trainer.grad_accum=1 --set settings.collective_timeout_s=60" + strategy +
                                " --run-dir " + dir_.file("many")), log), 0)
      << log;
  EXPECT_NE(log.find("parallel/" + c.strategy + ": "), std::string::npos) << log;

  const auto one = read_metrics(dir_.file("one") + "/metrics.jsonl");
  const auto many = read_metrics(dir_.file("many") + "/metrics.jsonl");
  ASSERT_EQ(one.size(), 5u);
  ASSERT_EQ(many.size(), 5u) << log;
  for (size_t i = 0; i < one.size(); ++i) {
    const double l1 = one[i]["loss"], ln = many[i]["loss"], g1 = one[i]["grad_norm"], gn = many[i]["grad_norm"];
    EXPECT_NEAR(ln, l1, 1e-5 * l1) << "step " << i + 1;
    EXPECT_NEAR(gn, g1, 1e-4 * g1) << "step " << i + 1;
    EXPECT_EQ(many[i]["tokens"], one[i]["tokens"]);
  }

  const HeldBytes single = held_bytes(one_log).at(0);
  const auto per_rank = held_bytes(log);
  ASSERT_EQ(per_rank.size(), static_cast<size_t>(c.ranks)) << log;
  const double n = c.ranks;
  for (const auto& [rank, held] : per_rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    // Within padding to a multiple of the world size and AdamW's 8-byte step counts.
    auto about = [](double actual, double expected) { return std::abs(actual - expected) <= 0.03 * expected + 512; };
    const bool opt_sharded = c.strategy != "ddp";
    const bool grads_sharded = c.strategy == "zero2" || c.strategy == "fsdp";
    const bool params_sharded = c.strategy == "fsdp";
    EXPECT_TRUE(about(held.optimizer, opt_sharded ? single.optimizer / n : single.optimizer)) << held.optimizer;
    EXPECT_TRUE(about(held.parameters, params_sharded ? single.parameters / n : single.parameters)) << held.parameters;
    if (grads_sharded) EXPECT_TRUE(about(held.gradients, single.parameters / n)) << held.gradients;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, Launch,
                         ::testing::Values(LaunchCase{"ddp", 2}, LaunchCase{"ddp", 3}, LaunchCase{"zero1", 2},
                                           LaunchCase{"zero1", 3}, LaunchCase{"zero2", 2}, LaunchCase{"zero2", 3},
                                           LaunchCase{"fsdp", 2}, LaunchCase{"fsdp", 3}),
                         [](const ::testing::TestParamInfo<LaunchCase>& info) {
                           return info.param.strategy + "_" + std::to_string(info.param.ranks) + "_ranks";
                         });

TEST_F(Cli, FsdpRanksSampleTextTogether) {
  // Under fsdp a forward pass is a collective: a callback that runs the model (sample_text) must
  // do so on every rank, or rank 0 would wait for the others until the timeout.
  const std::string spec = dir_.write("sampled.yaml", "include: [" + tiny() + "]\n"
      "components:\n"
      "  parallel: {component_key: parallel, variant_key: fsdp}\n"
      "  callbacks:\n"
      "    - {component_key: callback, variant_key: sample_text,\n"
      "       config: {tokenizer: {component_key: tokenizer, variant_key: bytes}, max_new_tokens: 8, every: 2}}\n");
  std::string out;
  ASSERT_EQ(run_command(tessera("launch --nproc-per-node 2 -- train " + spec + data_set() +
                                " --set trainer.max_steps=5 --set settings.collective_timeout_s=20 --run-dir " +
                                dir_.file("sampled")), out), 0)
      << out;
  std::ifstream samples(dir_.file("sampled") + "/samples.txt");
  std::stringstream text;
  text << samples.rdbuf();
  EXPECT_NE(text.str().find("--- step 4 ---"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("--- step 5 ---"), std::string::npos) << text.str();
}

TEST_F(Cli, KillingOneRankMidRunEndsTheOthersWithinTheTimeout) {
  // Two ranks started as torchrun would (no launcher to stop the survivor); rank 1 is SIGKILLed
  // once training runs. Rank 0 must fail (non-zero) within the collective timeout, not hang.
  const std::string port = std::to_string(testing::free_loopback_port());
  const std::string metrics = dir_.file("killed") + "/metrics.jsonl";
  const std::string rank_cmd = tessera("train " + tiny() + data_set() + " --set trainer.max_steps=100000" +
                                       " --set settings.collective_timeout_s=10 --run-dir " + dir_.file("killed"));
  const std::string script =
      "export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + "; RANK=1 " + rank_cmd + " > " +
      dir_.file("rank1.log") + " 2>&1 & p1=$!; RANK=0 " + rank_cmd + " > " + dir_.file("rank0.log") +
      " 2>&1 & p0=$!; for i in $(seq 600); do [ -f " + metrics + " ] && [ $(wc -l < " + metrics +
      ") -ge 3 ] && break; sleep 0.1; done; kill -KILL $p1; start=$(date +%s); wait $p0; rc=$?; "
      "echo rc=$rc seconds=$(( $(date +%s) - start ))";
  std::string out, log0;
  ASSERT_EQ(run_command("sh -c '" + script + "'", out), 0) << out;
  run_command("cat " + dir_.file("rank0.log"), log0);
  const std::smatch m = [&] {
    std::smatch match;
    std::regex_search(out, match, std::regex(R"(rc=(\d+) seconds=(\d+))"));
    return match;
  }();
  ASSERT_EQ(m.size(), 3u) << out;
  EXPECT_NE(std::stoi(m[1]), 0) << log0;
  // It gives up at the 10 s collective timeout at the latest (a closed connection fails sooner);
  // the bound leaves room for a loaded machine and only tells giving up from hanging.
  EXPECT_LE(std::stoi(m[2]), 60) << "rank 0 must give up, not wait on its dead peer\n" << log0;
  EXPECT_NE(log0.find("error: rank 0: a collective failed"), std::string::npos) << log0;
}

TEST_F(Cli, AMissingGpuIsAConfigErrorNotACrash) {
  std::string out;
  const int rc = run_command(tessera("train " + tiny() + data_set() + " --set settings.device=cuda:7 --run-dir " +
                                     dir_.file("gpu")), out);
  if (rc == 0) GTEST_SKIP() << "this machine has a cuda:7";
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("settings.device: this process needs cuda:7 but the machine has"), std::string::npos) << out;
  EXPECT_EQ(out.find("frame #"), std::string::npos) << "no C++ backtrace in a user-facing error: " << out;
}

TEST_F(Cli, AnExplicitGpuWithSeveralRanksOnTheNodeIsAPositionedError) {
  std::string out;
  const std::string spec = dir_.write("gpu.yaml", "include: " + tiny() + "\nsettings: {device: \"cuda:1\"}\n");
  EXPECT_EQ(run_command("LOCAL_WORLD_SIZE=2 " + tessera("validate " + spec + data_set()), out), 2) << out;
  EXPECT_NE(out.find(spec + ":2:20: settings.device: cuda:1 is one GPU, but this node runs 2 ranks"),
            std::string::npos)
      << out;
}

TEST_F(Cli, BadRankVariablesAreAConfigError) {
  std::string out;
  EXPECT_EQ(run_command("WORLD_SIZE=2 RANK=5 " + tessera("validate " + tiny() + data_set()), out), 2);
  EXPECT_NE(out.find("RANK 5 is not in a world of WORLD_SIZE 2"), std::string::npos) << out;
}

// validate checks what it can without running: the files and folders the spec reads exist and
// can be read, token files hold whole tokens and at least one window; each with its position.
TEST_F(Cli, ValidateChecksTheFilesTheSpecReads) {
  std::string out;
  const std::string missing = dir_.write("missing.yaml",
                                         "include: " + tiny() + "\n"
                                         "components:\n"
                                         "  train_data:\n"
                                         "    config: {path: " + dir_.file("nope.bin") + "}\n");
  EXPECT_EQ(run_command(tessera("validate " + missing), out), 2) << out;
  EXPECT_NE(out.find(missing + ":4:20: components.train_data.config.path: no such file or folder: " +
                     dir_.file("nope.bin")),
            std::string::npos)
      << out;
  // The same spec is well-formed: told not to look at the disk, validate accepts it.
  EXPECT_EQ(run_command(tessera("validate " + missing + " --skip-path-checks"), out), 0) << out;

  const std::string odd = dir_.write("odd.bin", "12345");  // 5 bytes: not whole uint16 tokens
  EXPECT_EQ(run_command(tessera("validate " + tiny() + " --set components.train_data.config.path=" + odd), out), 2);
  EXPECT_NE(out.find("components.train_data.config.path: " + odd + " has 5 bytes, not a multiple of 2 (uint16)"),
            std::string::npos)
      << out;
  const std::string short_file = dir_.write("short.bin", std::string(40, 'a'));  // 20 tokens < 33
  EXPECT_EQ(run_command(tessera("validate " + tiny() + " --set components.train_data.config.path=" + short_file), out),
            2);
  EXPECT_NE(out.find(short_file + " has 20 tokens, fewer than one window of seq_len + 1 = 33"), std::string::npos)
      << out;

  EXPECT_EQ(run_command(tessera("validate " + tiny() + data_set() + " --set components.model.config.init_from=" +
                                dir_.file("no-such-model")),
                        out),
            2);
  EXPECT_NE(out.find("components.model.config.init_from: no such file or folder"), std::string::npos) << out;
  EXPECT_EQ(run_command(tessera("validate " + tiny() + data_set() + " --set plugins.paths=[" + dir_.file("plugins") +
                                "]"),
                        out),
            2);
  EXPECT_NE(out.find("plugins.paths[0]: no such file or folder"), std::string::npos) << out;

  if (::geteuid() != 0) {  // root reads any file
    const std::string locked = dir_.write("locked.bin", std::string(4096, 'a'));
    std::filesystem::permissions(locked, std::filesystem::perms::none);
    EXPECT_EQ(run_command(tessera("validate " + tiny() + " --set components.train_data.config.path=" + locked), out),
              2);
    EXPECT_NE(out.find("cannot read " + locked + ": Permission denied"), std::string::npos) << out;
  }
}

// Every run spec the project ships validates (configs/gpt2-124m.yaml names a GPU and data this
// machine may not have: validation checks the spec, not the machine).
TEST_F(Cli, EveryShippedConfigValidates) {
  std::vector<std::filesystem::path> configs;
  for (const auto& entry : std::filesystem::directory_iterator(testing::source_dir() + "/configs")) {
    if (entry.path().extension() == ".yaml") configs.push_back(entry.path());
  }
  ASSERT_GE(configs.size(), 4u);
  for (const auto& config : configs) {
    std::string out;
    EXPECT_EQ(run_command(tessera("validate " + config.string() + " --set plugins.paths=[] --skip-path-checks"), out), 0)
        << config << "\n" << out;
  }
}

}  // namespace cli_test
}  // namespace tessera
