// Token ids against the model's vocabulary, on the host, before the batch reaches the device; and
// the trainer's use of it: a token file written for a larger vocabulary ends the step with one
// error naming the dataset, the step and the id, instead of an index error inside the model.
#include "tessera/run/token_check.hpp"

#include <gtest/gtest.h>

#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include "gloo_ranks.hpp"
#include "small_trainer.hpp"
#include "tessera/error.hpp"
#include "tessera/components/evaluate.hpp"

namespace tessera {
namespace token_check_test {

Batch batch_of(std::vector<std::int64_t> inputs, std::vector<std::int64_t> labels) {
  Batch b;
  b.input_ids = at::tensor(inputs, at::kLong).view({2, -1});
  b.labels = at::tensor(labels, at::kLong).view({2, -1});
  return b;
}

std::string error_of(const Batch& b, std::int64_t vocab) {
  try {
    check_token_ids(b, vocab);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenCheck, IdsInsideTheVocabularyAndIgnoredLabelsPass) {
  EXPECT_EQ(error_of(batch_of({0, 1, 2, 3}, {1, 2, 3, kIgnoreIndex}), 4), "");
  EXPECT_EQ(error_of(batch_of({0, 1, 2, 9}, {1, 2, 3, 9}), 0), "") << "vocab 0: not checked";
}

TEST(TokenCheck, AnIdPastTheVocabularyIsNamedWithItsPlace) {
  const std::string input_error = error_of(batch_of({0, 1, 2, 4}, {1, 2, 3, 0}), 4);
  EXPECT_NE(input_error.find("input_ids holds token id 4 (row 1, position 1)"), std::string::npos) << input_error;
  EXPECT_NE(input_error.find("vocabulary of 4 ids"), std::string::npos) << input_error;
  const std::string label_error = error_of(batch_of({0, 1, 2, 3}, {1, -1, 3, 0}), 4);
  EXPECT_NE(label_error.find("labels holds token id -1 (row 0, position 1)"), std::string::npos) << label_error;
  EXPECT_NE(error_of(batch_of({-100, 1, 2, 3}, {1, 2, 3, 0}), 4), "") << "kIgnoreIndex is for labels only";
}

TEST(TokenCheck, TheTrainerRefusesATokenFileWrittenForALargerVocabulary) {
  testing::TempDir dir;
  std::vector<std::uint16_t> tokens(400, 5);
  tokens[250] = 40;  // the model of components_yaml has 32 ids
  const std::string path = dir.file("tokens.bin");
  testing::write_token_file(path, tokens);
  auto run = testing::make_trainer(testing::components_yaml(path), testing::settings(1, 4, 10));
  try {
    for (int i = 0; i < 10; ++i) run.trainer->step();
    ADD_FAILURE() << "no error for token id 40";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train_data"), std::string::npos) << what;
    EXPECT_NE(what.find("next_batch"), std::string::npos) << what;
    EXPECT_NE(what.find("holds token id 40"), std::string::npos) << what;
    EXPECT_NE(what.find("vocabulary of 32 ids"), std::string::npos) << what;
  }
}

TEST(TokenCheck, EvaluateLossRefusesATokenFileWrittenForALargerVocabulary) {
  // What the evaluation callback and `tessera eval` run: the batch is checked before the model.
  testing::TempDir dir;
  std::vector<std::uint16_t> tokens(400, 5);
  tokens[250] = 40;  // past the 32 ids of components_yaml's model
  const std::string path = dir.file("tokens.bin");
  testing::write_token_file(path, tokens);
  auto run = testing::make_trainer(testing::components_yaml(path), testing::settings(1, 4, 10));
  auto data = testing::built<Dataset>(run.components, "train_data");
  try {
    evaluate_loss(run.trainer->model(), run.trainer->loss(), *data, 10, 4, run.trainer->context());
    ADD_FAILURE() << "no error for token id 40";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("holds token id 40"), std::string::npos) << what;
    EXPECT_NE(what.find("vocabulary of 32 ids"), std::string::npos) << what;
  }
  EXPECT_TRUE(run.trainer->model().is_training()) << "the model is left in training mode after the error";
}

// Two ranks evaluating, rank 1's data holding an id past the vocabulary: both stop at the same
// batch, rank 1 with its error and rank 0 saying another rank failed, instead of rank 0 waiting
// in the result's all-reduce for a rank that left.
TEST(TokenCheck, ARankWhoseEvaluationDataFailsStopsEveryRank) {
  testing::TempDir dir;
  const std::string good = dir.file("good.bin"), bad = dir.file("bad.bin");
  testing::write_token_file(good, std::vector<std::uint16_t>(400, 5));
  testing::write_token_file(bad, std::vector<std::uint16_t>(400, 40));
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t r, std::shared_ptr<Communicator> comm) {
    auto run = testing::make_trainer(testing::components_yaml(r == 0 ? good : bad), testing::settings(1, 4, 10));
    auto data = testing::built<Dataset>(run.components, "train_data");
    data->set_shard(r, 2);
    evaluate_loss(run.trainer->model(), run.trainer->loss(), *data, 3, 2, testing::rank_context(comm, 42));
  });
  EXPECT_NE(errors[1].find("holds token id 40"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("the evaluation data failed on another rank"), std::string::npos) << errors[0];
}

}  // namespace token_check_test
}  // namespace tessera
