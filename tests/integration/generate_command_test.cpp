// `tessera generate` and `tessera chat` through the real binary on the tiny spec with a byte
// tokenizer: rows in input order equal to greedy full forwards of a checkpoint's model, the same
// from its export, tensor- and data-parallel ranks writing what one rank writes, stop strings,
// the chat's turns and /reset, and one line naming the row for bad input.
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "tessera/core/run/training_run.hpp"

namespace tessera {
namespace generate_command_test {

namespace fs = std::filesystem;

struct Greedy {
  std::vector<std::int64_t> ids;
  std::vector<double> logprobs;
};

// Greedy continuation by full forwards over the whole text, the reference the KV cache must meet.
Greedy full_forward_greedy(Model& model, std::vector<std::int64_t> text, std::int64_t n) {
  c10::NoGradGuard no_grad;
  model.eval();
  Greedy out;
  for (std::int64_t i = 0; i < n; ++i) {
    const at::Tensor logits = model.forward(at::tensor(text, at::kLong).view({1, -1}))[0][-1];
    const std::int64_t next = logits.argmax().item<std::int64_t>();
    out.ids.push_back(next);
    out.logprobs.push_back(at::log_softmax(logits.to(at::kFloat), -1)[next].item<double>());
    text.push_back(next);
  }
  return out;
}

std::vector<std::int64_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

class GenerateCommand : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    run_dir_ = dir_.file("run");
    // The tiny spec with a byte tokenizer, its runs in run_dir_.
    spec_ = dir_.write("spec.yaml", "include: [" + tiny() + "]\nsettings: {run_dir: " + run_dir_ +
                                        "}\ncomponents:\n  tokenizer: {component_key: tokenizer, variant_key: bytes}\n");
  }

  // Trains the spec 6 steps, saving a checkpoint and a Hugging Face export at the end.
  void train(const std::string& extra = "") {
    std::string out;
    ASSERT_EQ(run_command(tessera("train " + spec_ + data_set() + extra +
                                  " --set trainer.max_steps=6 --set checkpoint.export_at_end=true"
                                  " --set checkpoint.export_format=hf"),
                          out),
              0)
        << out;
  }

  // Runs a command; its stdout, with stderr kept apart in last_error_.
  std::string run(const std::string& command, int expected_rc = 0) {
    std::string out;
    const int rc = run_command("(" + command + " 2>" + dir_.file("err.txt") + ")", out);
    std::ifstream err(dir_.file("err.txt"));
    last_error_.assign(std::istreambuf_iterator<char>(err), {});
    EXPECT_EQ(rc, expected_rc) << command << "\n" << out << last_error_;
    return out;
  }

  std::vector<nlohmann::json> rows(const std::string& text) {
    std::vector<nlohmann::json> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }

  std::string prompts(const std::string& lines) { return dir_.write("prompts.jsonl", lines); }

  std::string run_dir_, spec_, last_error_;
};

TEST_F(GenerateCommand, GreedyRowsInInputOrderEqualFullForwardsOfTheCheckpointAndItsExport) {
  train();
  const std::string file = prompts(
      "{\"prompt\": \"The \"}\n"
      "\n"
      "{\"prompt_ids\": [84, 104], \"max_new_tokens\": 5}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_new_tokens\": 4}\n");
  const auto from_checkpoint =
      rows(run(tessera("generate " + spec_ + " --resume auto --prompts " + file + " --temperature 0 --max-new-tokens 6")));
  ASSERT_EQ(from_checkpoint.size(), 3u);

  // The checkpoint's model as the trainer restores it (`tessera eval`'s path).
  core::RunOptions options;
  options.config_path = spec_;
  options.overrides = {"components.train_data.config.path=" + data_};
  options.evaluate_only = true;
  core::TrainingRun training(options);
  auto trainer = training.make_trainer();
  trainer->restore_model(run_dir_ + "/checkpoints/step_00000006");
  const std::vector<std::vector<std::int64_t>> expected_prompts = {
      bytes_of("The "), {84, 104}, bytes_of("user: hi\nassistant: ")};
  const std::vector<std::int64_t> lengths = {6, 5, 4};
  for (std::size_t i = 0; i < 3; ++i) {
    const nlohmann::json& row = from_checkpoint[i];
    EXPECT_EQ(row.at("index"), i);
    EXPECT_EQ(row.at("prompt_ids").get<std::vector<std::int64_t>>(), expected_prompts[i]);
    const Greedy greedy = full_forward_greedy(trainer->model(), expected_prompts[i], lengths[i]);
    EXPECT_EQ(row.at("completion_ids").get<std::vector<std::int64_t>>(), greedy.ids) << "row " << i;
    const auto logprobs = row.at("logprobs").get<std::vector<double>>();
    ASSERT_EQ(logprobs.size(), greedy.logprobs.size());
    for (std::size_t t = 0; t < logprobs.size(); ++t) EXPECT_NEAR(logprobs[t], greedy.logprobs[t], 1e-5);
    EXPECT_EQ(row.at("finish_reason"), "length");
    const std::string text = row.at("text").get<std::string>();
    if (text.find("\xEF\xBF\xBD") == std::string::npos) {  // bytes that make UTF-8 come back whole
      EXPECT_EQ(bytes_of(text), greedy.ids);
    }
  }

  // The export of the same step, as init_from, generates the same tokens.
  const auto from_export = rows(run(tessera("generate " + spec_ + " --prompts " + file +
                                            " --temperature 0 --max-new-tokens 6 --set components.model.config."
                                            "init_from=" + run_dir_ + "/exports/step_00000006")));
  ASSERT_EQ(from_export.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(from_export[i].at("completion_ids"), from_checkpoint[i].at("completion_ids")) << "row " << i;
  }
  // --prompt prints the completion's text alone.
  const std::string printed = run(tessera("generate " + spec_ + " --resume auto --prompt 'The ' --temperature 0 "
                                          "--max-new-tokens 6"));
  const auto first_ids = from_checkpoint[0].at("completion_ids").get<std::vector<std::int64_t>>();
  EXPECT_EQ(printed, std::string(first_ids.begin(), first_ids.end()) + "\n");
}

TEST_F(GenerateCommand, TensorAndDataParallelRanksWriteWhatOneRankWrites) {
  train();
  std::string lines;
  for (int i = 0; i < 5; ++i) lines += "{\"prompt_ids\": [" + std::to_string(65 + i) + ", 32, 66]}\n";
  // One prompt a batch: each row is computed alike however the rows are split.
  const std::string args = spec_ + " --resume auto --prompts " + prompts(lines) + " --max-new-tokens 5 --batch-size 1";
  // Under the launcher, whose stdout carries each line's rank, rank 0 writes --out.
  const auto out_file = [&](const std::string& name) {
    std::ifstream in(dir_.file(name));
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Sampled with each row's own seed: the split over ranks changes nothing.
  run(tessera("generate " + args + " --out " + dir_.file("one.jsonl")));
  run(tessera("launch --nproc-per-node 2 -- generate " + args + " --out " + dir_.file("dp.jsonl")));
  ASSERT_FALSE(out_file("one.jsonl").empty());
  EXPECT_EQ(out_file("dp.jsonl"), out_file("one.jsonl")) << "two data-parallel ranks";
  const auto greedy = rows(run(tessera("generate " + args + " --temperature 0")));
  run(tessera("launch --nproc-per-node 2 -- generate " + args + " --temperature 0 --set parallelism.tp=2 --out " +
              dir_.file("tp.jsonl")));
  const auto tp = rows(out_file("tp.jsonl"));
  ASSERT_EQ(tp.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(tp[i].at("completion_ids"), greedy[i].at("completion_ids")) << "row " << i;
    const auto a = tp[i].at("logprobs").get<std::vector<double>>(), b = greedy[i].at("logprobs").get<std::vector<double>>();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t t = 0; t < a.size(); ++t) EXPECT_NEAR(a[t], b[t], 1e-5);
  }
}

TEST_F(GenerateCommand, StopStringsEndTheTextBeforeThem) {
  train();
  const std::string file = prompts("{\"prompt_ids\": [84, 104, 101, 32]}\n");
  const auto plain = rows(run(tessera("generate " + spec_ + " --resume auto --prompts " + file +
                                      " --temperature 0 --max-new-tokens 12")));
  const auto ids = plain.at(0).at("completion_ids").get<std::vector<std::int64_t>>();
  ASSERT_EQ(ids.size(), 12u);
  // Two generated bytes that a shell passes in quotes; the completion ends with the first token
  // that completes them, and the text before them.
  const std::string text(ids.begin(), ids.end());
  const auto plain_byte = [](char c) { return c >= 0x20 && c < 0x7f && c != '\'' && c != '\\'; };
  std::size_t from = 1;
  while (from + 1 < text.size() && !(plain_byte(text[from]) && plain_byte(text[from + 1]))) ++from;
  ASSERT_LT(from + 1, text.size()) << "no two printable bytes in a row among the greedy ones";
  const std::string stop = text.substr(from, 2);
  const std::size_t at = text.find(stop);
  const auto stopped = rows(run(tessera("generate " + spec_ + " --resume auto --prompts " + file +
                                        " --temperature 0 --max-new-tokens 12 --stop '" + stop + "'")));
  EXPECT_EQ(stopped.at(0).at("finish_reason"), "stop");
  EXPECT_EQ(stopped.at(0).at("completion_ids").get<std::vector<std::int64_t>>(),
            std::vector<std::int64_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(at + 2)));
  const auto cut = stopped.at(0).at("text").get<std::string>();
  EXPECT_EQ(cut.find(stop), std::string::npos) << cut;
  const std::string before = text.substr(0, at);
  if (std::all_of(before.begin(), before.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    EXPECT_EQ(cut, before);  // (bytes that are not UTF-8 come back as U+FFFD)
  }
}

TEST_F(GenerateCommand, ChatStreamsRepliesFromItsHistoryAndResetForgetsIt) {
  // Room for two turns of sft_jsonl's plain lines.
  const std::string longer = " --set components.model.config.max_seq_len=64";
  train(longer);
  // Three turns: hello, again (after hello's reply), then hello in a new conversation.
  const std::string input = dir_.write("turns.txt", "hello\nagain\n/reset\nhello\n/exit\n");
  const std::string out = run(tessera("chat " + spec_ + longer + " --resume auto --temperature 0 --max-new-tokens 3") + " < " +
                              input);

  core::RunOptions options;
  options.config_path = spec_;
  options.overrides = {"components.train_data.config.path=" + data_, "components.model.config.max_seq_len=64"};
  options.evaluate_only = true;
  core::TrainingRun training(options);
  auto trainer = training.make_trainer();
  trainer->restore_model(run_dir_ + "/checkpoints/step_00000006");
  const Greedy first = full_forward_greedy(trainer->model(), bytes_of("user: hello\nassistant: "), 3);
  const std::string reply(first.ids.begin(), first.ids.end());
  // The second turn continues the whole conversation (sft_jsonl's plain lines without a template).
  const Greedy second = full_forward_greedy(
      trainer->model(), bytes_of("user: hello\nassistant: " + reply + "\nuser: again\nassistant: "), 3);
  const std::string second_reply(second.ids.begin(), second.ids.end());
  EXPECT_EQ(out, "> " + reply + "\n> " + second_reply + "\n> (a new conversation)\n> " + reply + "\n> \n");
}

TEST_F(GenerateCommand, BadInputIsOneLineNamingTheRowAndExitsTwo) {
  const std::string spec = spec_ + data_set();
  const auto one_error_line = [&](const std::string& expected) {
    EXPECT_NE(last_error_.find(expected), std::string::npos) << last_error_;
    std::size_t error_lines = 0;
    for (std::size_t at = last_error_.find("error: "); at != std::string::npos; at = last_error_.find("error: ", at + 1)) {
      ++error_lines;
    }
    EXPECT_EQ(error_lines, 1u) << last_error_;
  };
  run(tessera("generate " + spec + " --prompts " + prompts("{\"prompt\": \"a\"}\n{\"promt\": \"b\"}\n")), 2);
  one_error_line("prompts.jsonl:2: row 1: unknown field 'promt'");
  run(tessera("generate " + spec + " --prompts " + prompts("\n")), 2);
  one_error_line("prompts.jsonl: holds no prompts");
  run(tessera("generate " + spec + " --prompts " + prompts("{\"prompt_ids\": [1, 2], \"max_new_tokens\": 31}\n")), 2);
  one_error_line("prompts.jsonl:1: row 0: a prompt of 2 tokens and max_new_tokens 31 pass the model's max_seq_len 32");
  run(tessera("generate " + spec + " --prompts " + prompts(std::string("{\"prompt\": \"") + std::string(40, 'x') + "\"}\n")),
      2);
  one_error_line("row 0: the prompt's 40 tokens leave no room under the model's max_seq_len 32");
  run(tessera("generate " + spec + " --prompts " + prompts("{\"prompt\": 3}\n[1]\n")), 2);
  one_error_line("row 0: prompt must be a string");
  run(tessera("generate " + tiny() + data_set() + " --prompt hello"), 2);
  one_error_line("--prompt: a text prompt needs a tokenizer, and the spec has none");
  run(tessera("generate " + tiny() + data_set() + " --prompts " + prompts("{\"prompt_ids\": [1]}\n") + " --stop x"), 2);
  one_error_line("--stop reads the completions' text, which needs a tokenizer");
}

}  // namespace generate_command_test
}  // namespace tessera
