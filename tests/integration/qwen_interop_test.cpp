// The Qwen variants of the Llama family against transformers itself: tiny random Qwen2ForCausalLM
// (q/k/v biases, a tied head, a sliding window shorter than the sequences on its second block)
// and Qwen3ForCausalLM (per-head q/k norms, head_dim apart from hidden / heads, attention biases)
// folders, with perturbed norms and biases, are imported by `init_from` into model/qwen2 and
// model/qwen3: `tessera eval` gives transformers' loss; a short run's `hf` export loads in
// transformers strictly with the loss Tessera gives; a folder of another variant is one
// positioned error naming the variant to use.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "test_support.hpp"

namespace tessera {
namespace qwen_interop_test {

TEST_F(HfInterop, QwenImportsGiveTransformersLossAndTheirExportsLoadStrictly) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  const std::string qwen2 = dir_.file("qwen2"), qwen3 = dir_.file("qwen3");
  reference("make-qwen2 " + qwen2 + " --tied --window 8 --max-window-layers 1");
  reference("make-qwen3 " + qwen3 + " --head-dim 24 --attention-bias");
  // The window is in effect: without it transformers' loss is another.
  EXPECT_GT(relative(reference_loss(qwen2, tokens, "--mutate window"), reference_loss(qwen2, tokens)),
            3 * kLossTolerance);

  for (const auto& [variant, folder] : {std::pair<std::string, std::string>{"qwen2", qwen2}, {"qwen3", qwen3}}) {
    SCOPED_TRACE(variant);
    const double expected = reference_loss(folder, tokens);
    const std::string path = spec(variant, model_yaml(variant, folder), tokens);
    EXPECT_LT(relative(tessera_eval(path), expected), kLossTolerance);

    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() + " train " + path + " --set checkpoint.export_format=hf", out), 0)
        << out;
    const std::string exported = dir_.file("runs/" + variant + "/exports/step_00000003");
    const double in_transformers = reference_loss(exported, tokens, "--strict");
    EXPECT_LT(relative(tessera_eval(path, "--resume auto"), in_transformers), kLossTolerance);
    EXPECT_GT(relative(in_transformers, expected), 1e-3) << "training changed nothing";
  }

  // Another variant's folder: the error names the variant that imports it.
  for (const auto& [variant, folder, use] :
       {std::tuple<std::string, std::string, std::string>{"llama", qwen3, "use model/qwen3"},
        {"qwen3", qwen2, "use model/qwen2"},
        {"qwen2", qwen3, "use model/qwen3"}}) {
    std::string out;
    EXPECT_EQ(run_command(testing::tessera_binary() + " validate " +
                              spec(variant + "-wrong", model_yaml(variant, folder), tokens),
                          out),
              2)
        << out;
    EXPECT_NE(out.find("init_from"), std::string::npos) << out;
    EXPECT_NE(out.find(use), std::string::npos) << out;
  }
}

// Qwen3-MoE: a dense first block (mlp_only_layers [0]) before two routed ones, experts of their
// own width, normalised gates; then unnormalised (Hugging Face's default) with every other block
// routed (decoder_sparse_step 2). Each import gives transformers' loss; a run's export loads
// strictly with Tessera's loss; an expert-parallel run exports the model one rank trains.
TEST_F(HfInterop, Qwen3MoeImportsGiveTransformersLossAndExpertParallelRunsExportWholeModels) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  const std::string normalised = dir_.file("qwen3_moe"), stepped = dir_.file("qwen3_moe_stepped");
  reference("make-qwen3-moe " + normalised + " --dense-blocks 0 --norm-topk --attention-bias");
  reference("make-qwen3-moe " + stepped + " --sparse-step 2 --layers 4 --top-k 1");
  for (const std::string& folder : {normalised, stepped}) {
    SCOPED_TRACE(folder);
    EXPECT_LT(relative(tessera_eval(spec("import", model_yaml("qwen3_moe", folder), tokens)),
                       reference_loss(folder, tokens)),
              kLossTolerance);
  }
  // Without the balance loss (a micro-batch statistic), one rank accumulating two micro-batches
  // computes the 2 ranks' steps.
  const auto runs = one_rank_and_ep2("qwen3-moe", model_yaml("qwen3_moe", normalised, ", aux_loss_coef: 0"), tokens);
  EXPECT_GT(relative(runs[0].exported_loss, reference_loss(normalised, tokens)), 1e-3) << "training changed nothing";
  EXPECT_LT(relative(runs[1].exported_loss, runs[0].exported_loss), 1e-4) << "ep 2 against one rank";
}

}  // namespace qwen_interop_test
}  // namespace tessera
