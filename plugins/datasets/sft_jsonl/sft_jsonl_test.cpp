// dataset/sft_jsonl built through the real loader and factory with the byte tokenizer: prompt
// tokens are never targets, chat messages render and mask as documented, packing keeps examples
// whole, bad lines are positioned errors, and a step of the real trainer on 2 Gloo ranks with
// gradient accumulation has exactly the loss and gradient of a plain LibTorch computation over
// the same rows with the prompts masked, normalised by the global count of response tokens.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gloo_ranks.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "test_support.hpp"
#include "trainer_parts.hpp"

namespace tessera {
namespace sft_jsonl_test {

std::string data_yaml(const std::string& path, const std::string& extra) {
  return "{component_key: dataset, variant_key: sft_jsonl, config: {path: " + path +
         ", tokenizer: {component_key: tokenizer, variant_key: bytes}, shuffle: false" + extra + "}}";
}

std::shared_ptr<Dataset> make_sft(const std::string& path, const std::string& extra) {
  auto b = testing::build_components("data: " + data_yaml(path, extra) + "\n");
  auto data = testing::built<Dataset>(b, "data");
  data->set_shard(0, 1);
  return data;
}

std::vector<std::int64_t> row(const at::Tensor& t, std::int64_t i) {
  const at::Tensor r = t[i].contiguous();
  return {r.data_ptr<std::int64_t>(), r.data_ptr<std::int64_t>() + r.numel()};
}

constexpr std::int64_t I = kIgnoreIndex;

TEST(SftJsonl, OnlyTheResponseIsATarget) {
  testing::TempDir dir;
  const std::string path = dir.write("sft.jsonl", R"({"prompt": "ab", "response": "cd"})" "\n");
  auto data = make_sft(path, ", seq_len: 5, pack: false");
  const Batch batch = data->next_batch(1);
  // Tokens a b c d: inputs a b c, then padding; a label is the next token where it is a response token.
  EXPECT_EQ(row(batch.input_ids, 0), (std::vector<std::int64_t>{'a', 'b', 'c', 0, 0}));
  EXPECT_EQ(row(batch.labels, 0), (std::vector<std::int64_t>{I, 'c', 'd', I, I}));
  EXPECT_EQ(batch.num_target_tokens, 2);
}

TEST(SftJsonl, ChatMessagesMaskEverythingButTheAssistant) {
  testing::TempDir dir;
  const std::string path = dir.write(
      "chat.jsonl", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" "\n");
  auto data = make_sft(path, ", seq_len: 24, pack: false");
  const Batch batch = data->next_batch(1);
  // "user: hi\nassistant: yo\n": only y and o are targets (the byte tokenizer has no EOS).
  const std::string text = "user: hi\nassistant: yo\n";
  const auto labels = row(batch.labels, 0);
  for (std::size_t i = 0; i + 1 < text.size(); ++i) {
    const bool target = i + 1 == text.find("yo") || i + 1 == text.find("yo") + 1;
    EXPECT_EQ(labels[i], target ? static_cast<std::int64_t>(text[i + 1]) : I) << "position " << i;
  }
  EXPECT_EQ(batch.num_target_tokens, 2);
}

TEST(SftJsonl, PackingKeepsExamplesWhole) {
  testing::TempDir dir;
  std::string lines;
  for (int i = 0; i < 6; ++i) lines += R"({"prompt": "p)" + std::to_string(i) + R"(", "response": "rr"})" "\n";
  // Each example: 4 tokens -> 3 positions. Rows of 8 hold two (6 positions), then padding.
  auto packed = make_sft(dir.write("p.jsonl", lines), ", seq_len: 8");
  EXPECT_EQ(packed->num_samples(), 3);
  const Batch batch = packed->next_batch(1);
  EXPECT_EQ(row(batch.input_ids, 0), (std::vector<std::int64_t>{'p', '0', 'r', 'p', '1', 'r', 0, 0}));
  EXPECT_EQ(row(batch.labels, 0), (std::vector<std::int64_t>{I, 'r', 'r', I, 'r', 'r', I, I}));
  // Each example its own document; the padding one more.
  EXPECT_EQ(row(batch.document_ids, 0), (std::vector<std::int64_t>{0, 0, 0, 1, 1, 1, 2, 2}));
  EXPECT_EQ(make_sft(dir.file("p.jsonl"), ", seq_len: 8, pack: false")->num_samples(), 6);
}

// A state records the rows it is a position in: a resume over another file of as many rows is
// refused; a state saved before layouts were (epoch and position only) is still read.
TEST(SftJsonl, AStateOverOtherRowsIsRefused) {
  testing::TempDir dir;
  const std::string a = dir.write("a.jsonl", R"({"prompt": "ab", "response": "cd"})" "\n" R"({"prompt": "ef", "response": "gh"})" "\n");
  const std::string b = dir.write("b.jsonl", R"({"prompt": "ab", "response": "xy"})" "\n" R"({"prompt": "ef", "response": "gh"})" "\n");
  auto saved = make_sft(a, ", seq_len: 5, pack: false");
  saved->next_batch(1);
  const StateDict state = saved->state_dict();
  EXPECT_NO_THROW(make_sft(a, ", seq_len: 5, pack: false")->load_state_dict(state));
  try {
    make_sft(b, ", seq_len: 5, pack: false")->load_state_dict(state);
    ADD_FAILURE() << "a state over other rows was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("saved reading 2 rows of 5 tokens (checksum"), std::string::npos) << what;
    EXPECT_NE(what.find("resume with the file, tokenizer and config"), std::string::npos) << what;
  }
  auto old_state = make_sft(b, ", seq_len: 5, pack: false");
  EXPECT_NO_THROW(old_state->load_state_dict({{"epoch", state.at("epoch")}, {"position", state.at("position")}}));
  EXPECT_TRUE(old_state->state_dict().at("position").equal(state.at("position")));
}

TEST(SftJsonl, BadLinesArePositionedErrors) {
  testing::TempDir dir;
  auto message = [&](const std::string& text) {
    try {
      make_sft(dir.write("bad.jsonl", text), ", seq_len: 8");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{\"prompt\": \"a\", \"response\": \"b\"}\nnot json\n").find("bad.jsonl:2: not a JSON object"),
            std::string::npos);
  EXPECT_NE(message("{\"prompt\": \"a\"}\n").find("bad.jsonl:1: no field 'response'"), std::string::npos);
  EXPECT_NE(message("\n\n").find("holds no examples"), std::string::npos);
}

// One step on `world` ranks (grad_accum 2, micro-batches of 2 rows, SGD with lr 1): the loss and
// the weights' change, which is minus the gradient.
struct StepResult {
  double loss = 0;
  std::map<std::string, at::Tensor> before, after;
};

std::string run_yaml(const std::string& path) {
  return "model: {component_key: model, variant_key: gpt, config: {vocab_size: 256, n_layer: 1, n_head: 2, n_embd: 16, "
         "max_seq_len: 16}}\n"
         "train_data: " + data_yaml(path, ", seq_len: 16") + "\n"
         "loss: {component_key: loss, variant_key: cross_entropy}\n"
         "optimizer: {component_key: optimizer, variant_key: sgd, config: {lr: 1.0, model: {instance_key: model}}}\n"
         "parallel: {component_key: parallel, variant_key: ddp}\n";
}

std::mutex build_mutex;

TEST(SftJsonl, TrainerStepEqualsAPlainComputationOverResponseTokensOnTwoRanks) {
  testing::TempDir dir;
  std::string lines;
  for (int i = 0; i < 20; ++i) {
    lines += R"({"prompt": "q)" + std::to_string(i) + R"(?", "response": ")" +
             std::string(static_cast<std::size_t>(1 + i % 5), static_cast<char>('a' + i % 26)) + "\"}\n";
  }
  const std::string path = dir.write("train.jsonl", lines);
  StepResult results[2];
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t r, std::shared_ptr<Communicator> comm) {
    RunContext context;
    context.seed = 3;
    context.rank = r;
    context.world_size = 2;
    context.communicator = comm;
    core::BuiltComponents built;
    {
      std::lock_guard<std::mutex> lock(build_mutex);
      core::seed_everything(3, "cpu");
      built = testing::build_components(run_yaml(path), context);
    }
    core::TrainerSettings settings;
    settings.grad_accum = 2;
    settings.micro_batch_size = 2;
    settings.max_steps = 1;
    settings.clip_grad_norm = 0;
    settings.prefetch = 0;
    core::Trainer trainer(testing::trainer_parts(built), settings, context);
    StepResult& mine = results[r];
    for (const auto& item : trainer.model().named_parameters()) mine.before[item.key()] = item.value().detach().clone();
    mine.loss = trainer.step().loss;
    for (const auto& item : trainer.model().named_parameters()) mine.after[item.key()] = item.value().detach().clone();
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");

  // The reference: the same weights, the step's 8 rows (2 ranks x 2 micro-batches x 2) read in
  // order, the summed cross-entropy over response tokens divided by their number.
  core::seed_everything(3, "cpu");
  auto built = testing::build_components(run_yaml(path));
  auto model = testing::built<Model>(built, "model");
  auto data = testing::built<Dataset>(built, "train_data");
  data->set_shard(0, 1);
  const Batch all = data->next_batch(8);
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().equal(results[0].before.at(item.key()))) << "the ranks started elsewhere: " << item.key();
  }
  // Packed rows: the examples are kept apart (document_ids), as the trainer does.
  ASSERT_TRUE(all.document_ids.defined());
  const at::Tensor logits = model->forward(all.input_ids, all.document_ids);
  {
    c10::NoGradGuard no_grad;
    const at::Tensor unmasked = model->forward(all.input_ids);
    EXPECT_GT((unmasked - logits).abs().max().item<double>(), 1e-3) << "the rows pack no second example";
  }
  const at::Tensor sum = at::cross_entropy_loss(logits.flatten(0, 1), all.labels.flatten(), {}, at::Reduction::Sum, I);
  const double targets = static_cast<double>(all.num_target_tokens);
  ASSERT_EQ(all.num_target_tokens, (all.labels != I).sum().item<std::int64_t>());
  (sum / targets).backward();
  EXPECT_NEAR(results[0].loss, sum.item<double>() / targets, 1e-6);
  for (const auto& item : model->named_parameters()) {
    const at::Tensor grad = item.value().grad();
    for (int r = 0; r < 2; ++r) {
      const at::Tensor step = results[r].before.at(item.key()) - results[r].after.at(item.key());  // lr 1: the gradient
      EXPECT_TRUE(step.allclose(grad, 1e-5, 1e-6)) << "rank " << r << " " << item.key() << " differs by "
                                                   << (step - grad).abs().max().item<double>();
    }
  }
}

}  // namespace sft_jsonl_test
}  // namespace tessera
