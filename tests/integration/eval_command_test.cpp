// `tessera eval` through the real binary on the tiny spec: the JSON line, which data it reads
// (the evaluation callback's, or train_data), the model it evaluates (as built, or a
// checkpoint's), that it equals the evaluation callback's own loss, and its errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "cli_fixture.hpp"

namespace tessera {
namespace eval_command_test {

class EvalCommand : public Cli {
 protected:
  // Runs `tessera eval` and parses the one line it prints on stdout (stderr is the log).
  nlohmann::json eval(const std::string& args, int expected_rc = 0) {
    std::string out;
    // In a subshell: run_command sends stderr to the output after the command's own redirections.
    const int rc = run_command("(" + tessera("eval " + args) + " 2>" + dir_.file("eval.err") + ")", out);
    std::string err;
    run_command("cat " + dir_.file("eval.err"), err);
    EXPECT_EQ(rc, expected_rc) << out << err;
    last_error_ = err;
    if (rc != 0) return {};
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line on stdout: " << out;
    return nlohmann::json::parse(out);
  }

  // The tiny spec plus an evaluation callback on the same file read in order.
  std::string with_evaluation() {
    return dir_.write("with_eval.yaml",
                      "include: [" + tiny() + "]\n" +
                          "components:\n"
                          "  train_data: {component_key: dataset, variant_key: tokens, config: {path: " +
                          data_ + ", seq_len: 32}}\n"
                          "  callbacks:\n"
                          "    - component_key: callback\n      variant_key: evaluation\n"
                          "      config:\n"
                          "        data: {component_key: dataset, variant_key: tokens, config: {path: " +
                          data_ + ", seq_len: 32, shuffle: false}}\n" +
                          "        loss: {instance_key: loss, pass_type: BY_REFERENCE}\n"
                          "        every: 0\n        batches: 4\n        micro_batch_size: 2\n");
  }

  static std::string read_file(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string last_error_;
};

TEST_F(EvalCommand, PrintsTheMeanLossTokensAndBatchesOfTheEvaluationData) {
  const nlohmann::json result = eval(with_evaluation() + " --batches 4");
  ASSERT_TRUE(result.is_object());
  // The evaluation callback's micro_batch_size: 4 batches of 2 windows of 32 tokens.
  EXPECT_EQ(result.at("tokens").get<std::int64_t>(), 4 * 2 * 32);
  EXPECT_EQ(result.at("batches").get<std::int64_t>(), 4);
  // An untrained byte-level model: close to the uniform loss ln(256).
  EXPECT_NEAR(result.at("loss").get<double>(), std::log(256.0), 0.5);
  // --split train reads train_data at trainer.micro_batch_size (8).
  const nlohmann::json train = eval(tiny() + data_set() + " --split train --batches 2");
  EXPECT_EQ(train.at("tokens").get<std::int64_t>(), 2 * 8 * 32);
  EXPECT_EQ(eval(tiny() + data_set() + " --split train --batches 2 --micro-batch-size 3").at("tokens"), 2 * 3 * 32);
}

TEST_F(EvalCommand, EvaluatesTheCheckpointsModelWithTheEvaluationCallbacksLoss) {
  const std::string spec = with_evaluation();
  const std::string run_dir = dir_.file("run");
  std::string out;
  // Train 10 steps; the evaluation callback reports val loss at the end on the same 4 batches.
  ASSERT_EQ(run_command(tessera("train " + spec + " --set trainer.max_steps=10 --run-dir " + run_dir), out), 0) << out;
  const auto evals = read_eval_metrics(run_dir + "/metrics.jsonl");
  ASSERT_FALSE(evals.empty());
  const double callback_loss = evals.back().at("val/loss").get<double>();

  const std::string metrics_before = read_file(run_dir + "/metrics.jsonl");
  const nlohmann::json fresh = eval(spec + " --batches 4 --set settings.run_dir=" + run_dir);
  const nlohmann::json trained = eval(spec + " --batches 4 --resume auto --set settings.run_dir=" + run_dir);
  EXPECT_NEAR(trained.at("loss").get<double>(), callback_loss, 1e-6 * callback_loss);
  EXPECT_LT(trained.at("loss").get<double>(), fresh.at("loss").get<double>() - 0.1) << "the checkpoint was not used";
  // A checkpoint by path gives the same.
  const nlohmann::json by_path =
      eval(spec + " --batches 4 --resume " + run_dir + "/checkpoints/step_00000010 --set settings.run_dir=" + run_dir);
  EXPECT_EQ(by_path.at("loss"), trained.at("loss"));
  // On other data than it trained on (here other windows of train_data): the checkpoint's data
  // position belongs to the training run and is not read.
  const nlohmann::json other_windows = eval(spec + " --split train --batches 2 --resume auto --set settings.run_dir=" +
                                            run_dir + " --set components.train_data.config.seq_len=16");
  EXPECT_EQ(other_windows.at("tokens").get<std::int64_t>(), 2 * 8 * 16);
  // Evaluating writes nothing into the run: its metrics stay as training left them.
  EXPECT_EQ(read_file(run_dir + "/metrics.jsonl"), metrics_before);
}

TEST_F(EvalCommand, TwoRanksGiveTheOneRankLoss) {
  const std::string spec = with_evaluation();
  const nlohmann::json one = eval(spec + " --batches 4");
  std::string out, err;
  ASSERT_EQ(run_command("(" + tessera("launch --nproc-per-node 2 -- eval " + spec + " --batches 4") + " 2>" +
                            dir_.file("launch.err") + ")",
                        out),
            0)
      << out;
  run_command("cat " + dir_.file("launch.err"), err);
  // The launcher keeps the ranks' stdout and stderr apart: stdout is rank 0's result line alone,
  // the logs of both ranks are on stderr.
  ASSERT_EQ(out.rfind("[rank 0] {", 0), 0u) << out;
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(err.find("[rank 1] "), std::string::npos) << err;
  const nlohmann::json two = nlohmann::json::parse(out.substr(9));
  EXPECT_EQ(two.at("tokens"), one.at("tokens"));
  EXPECT_EQ(two.at("batches"), one.at("batches"));
  EXPECT_NEAR(two.at("loss").get<double>(), one.at("loss").get<double>(), 1e-6);
}

TEST_F(EvalCommand, MistakesAreOneErrorAndExitTwo) {
  // No evaluation callback: say so, and how to evaluate on the training data.
  eval(tiny() + data_set(), 2);
  EXPECT_NE(last_error_.find("no evaluation dataset"), std::string::npos) << last_error_;
  EXPECT_NE(last_error_.find("--split train"), std::string::npos) << last_error_;
  eval(tiny() + data_set() + " --split test", 2);
  EXPECT_NE(last_error_.find("--split must be eval or train"), std::string::npos) << last_error_;
  eval(tiny() + data_set() + " --split train --batches 0", 2);
  EXPECT_NE(last_error_.find("--batches"), std::string::npos) << last_error_;
  eval(tiny() + data_set() + " --split train --resume /nonexistent/step_00000001", 1);
  EXPECT_NE(last_error_.find("/nonexistent/step_00000001"), std::string::npos) << last_error_;
}

TEST_F(EvalCommand, HfExportOfAModelWithoutOneIsRefusedBeforeTraining) {
  std::string out;
  const int rc = run_command(
      tessera("train " + tiny() + data_set() +
              " --set components.model.variant_key=gpt_moe --set checkpoint.export_format=hf --run-dir " +
              dir_.file("moe")),
      out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("checkpoint.export_format"), std::string::npos) << out;
  EXPECT_NE(out.find("no Hugging Face format"), std::string::npos) << out;
  EXPECT_EQ(out.find("step 1 "), std::string::npos) << "it trained first: " << out;
}

// Every shipped config evaluates with both splits, run from a folder laid out as the README's
// (build/, configs/, data/ made by the tools): the SFT and DPO specs share one tokenizer by
// reference, which `tessera eval` builds beside the dataset as `tessera train` does. The two
// that start from llama-tiny's export start from a one-step one. configs/gpt2-124m.yaml is left
// out: its data needs GPT-2's tokenizer from the hub.
TEST_F(EvalCommand, EveryShippedConfigEvaluatesWithBothSplits) {
  namespace fs = std::filesystem;
  const std::string src = testing::source_dir(), work = dir_.file("work");
  fs::create_directories(work + "/build");
  fs::create_directory_symlink(src + "/configs", work + "/configs");
  fs::create_directory_symlink(testing::plugin_dir(), work + "/build/plugins");
  const std::string python = src + "/.venv/bin/python3";
  std::string out;
  ASSERT_EQ(run_command("cd " + work + " && " + python + " " + src + "/tools/data/sft_arithmetic.py --out data/sft-arithmetic "
                            "--train 64 --val 16",
                        out),
            0)
      << out;
  // The quickstart's data, from a few fortune files (the whole of them takes longer).
  fs::create_directories(work + "/fortunes");
  for (const char* file : {"computers", "science", "wisdom"}) {
    fs::copy_file(std::string("/usr/share/games/fortunes/") + file, work + "/fortunes/" + file);
  }
  ASSERT_EQ(run_command("cd " + work + " && " + python + " " + src + "/tools/data/text_to_tokens.py fortunes "
                            "--fortune-split --out data/fortunes",
                        out),
            0)
      << out;
  // configs/llama-tiny-bpe.yaml's: a BPE trained on the fortunes, then `tessera prepare-data`
  // (tools/data/fortunes_bpe.sh's steps).
  ASSERT_EQ(run_command("cd " + work + " && " + python + " " + src + "/tools/data/fortunes_bpe.py --out data/fortunes-bpe",
                        out),
            0)
      << out;
  for (const std::string split : {"train", "val"}) {
    ASSERT_EQ(run_command("cd " + work + " && " +
                              tessera("prepare-data data/fortunes-bpe/" + split + ".jsonl --field text --out data/fortunes-bpe/" +
                                      split + ".bin --tokenizer '{variant_key: bpe, config: {path: "
                                      "data/fortunes-bpe/tokenizer.json}}' 2>&1"),
                          out),
              0)
          << out;
  }
  const std::string base = "runs/llama-tiny/exports/step_00000001";
  ASSERT_EQ(run_command("cd " + work + " && " + tessera("train configs/llama-tiny.yaml --set trainer.max_steps=1 "
                                                         "--set trainer.micro_batch_size=2 --set components.scheduler.config.warmup_steps=0 2>&1"),
                        out),
            0)
      << out;
  ASSERT_TRUE(fs::exists(work + "/" + base)) << out;

  int evaluated = 0;
  for (const auto& entry : fs::directory_iterator(src + "/configs")) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".yaml" || name == "gpt2-124m.yaml") continue;
    std::string args = "configs/" + name + " --batches 1 --micro-batch-size 2";
    if (name == "dpo-tiny.yaml" || name == "lora-llama-tiny.yaml") args += " --set components.model.config.init_from=" + base;
    if (name == "grpo-tiny.yaml") {
      // Scored by rewards on sampled completions: one error says eval does not evaluate it.
      const int rc = run_command("cd " + work + " && mkdir -p data/sums-2 && echo '{\"prompt\": \"1+1=\", \"answer\": \"2\"}' "
                                 "> data/sums-2/prompts.jsonl && (" +
                                     tessera("eval " + args + " --split train --set components.model.config.init_from=''") +
                                     " 2>&1)",
                                 out);
      EXPECT_EQ(rc, 2) << out;
      EXPECT_NE(out.find("tessera eval does not evaluate it"), std::string::npos) << out;
      continue;
    }
    const bool has_evaluation = read_file(entry.path().string()).find("variant_key: evaluation") != std::string::npos;
    for (const std::string split : {"eval", "train"}) {
      SCOPED_TRACE(name + " --split " + split);
      const int rc = run_command("cd " + work + " && (" + tessera("eval " + args + " --split " + split) + " 2>" +
                                     dir_.file("eval.err") + ")",
                                 out);
      std::string err;
      run_command("cat " + dir_.file("eval.err"), err);
      if (split == "eval" && !has_evaluation) {
        // No evaluation data: the one error that says so and what to do.
        EXPECT_EQ(rc, 2) << out << err;
        EXPECT_NE(err.find("no evaluation dataset"), std::string::npos) << err;
        continue;
      }
      ASSERT_EQ(rc, 0) << out << err;
      const auto result = nlohmann::json::parse(out.substr(out.rfind('{')));
      EXPECT_TRUE(std::isfinite(result.at("loss").get<double>())) << out;
      EXPECT_GT(result.at("tokens").get<double>(), 0) << out;
      if (name == "dpo-tiny.yaml") {
        // loss/dpo under TRL's evaluation names; the model as built is its own reference.
        EXPECT_NEAR(result.at("eval_rewards/margins").get<double>(), 0.0, 1e-6) << out;
        EXPECT_NEAR(result.at("loss").get<double>(), std::log(2.0), 1e-5) << out;
      }
      ++evaluated;
    }
  }
  EXPECT_GE(evaluated, 15);
}

}  // namespace eval_command_test
}  // namespace tessera
