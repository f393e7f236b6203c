// model/gemma3_text against transformers itself: a tiny random Gemma3ForCausalLM (sliding layers
// with a window shorter than the sequences beside global ones, the global rotary base scaled
// linearly, (1 + weight) norms perturbed, the logits softcapped) imported by `init_from`:
// `tessera eval` gives transformers' loss, from whole logits and chunked; a few steps' `hf` export
// loads strictly in transformers with Tessera's loss; tp 2 (with and without sequence
// parallelism), pp 2 and fsdp train what one rank trains; cp refuses the window. (transformers'
// Gemma3 ignores attn_logit_softcapping, which Tessera computes as Gemma 2 does: the kit's unit
// tests check the capped scores.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "test_support.hpp"

namespace tessera {
namespace gemma3_interop_test {

TEST_F(HfInterop, Gemma3ImportsGiveTransformersLossAndEveryMeshTrainsAsOneRank) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  const std::string gemma = dir_.file("gemma3"), softcapped = dir_.file("gemma3_softcapped");
  reference("make-gemma3 " + gemma + " --window 8 --pattern 2 --rope-factor 8 --final-softcap 3 --std 0.2");
  reference("make-gemma3 " + softcapped + " --layers 3 --pattern 3 --attn-softcap 2 --std 0.2");
  const double expected = reference_loss(gemma, tokens);
  // The window and the logits' softcap are in effect: without them transformers' loss is another.
  EXPECT_GT(relative(reference_loss(gemma, tokens, "--mutate window"), expected), 3 * kLossTolerance);
  EXPECT_GT(relative(reference_loss(gemma, tokens, "--mutate final-softcap"), expected), 3 * kLossTolerance);
  // The logits whole, and a chunk of tokens at a time (the chunked cross-entropy caps them too).
  const std::string eval = spec("eval", model_yaml("gemma3_text", gemma), tokens);
  EXPECT_LT(relative(tessera_eval(eval), expected), kLossTolerance);
  EXPECT_LT(relative(tessera_eval(eval, "--set components.loss.config.chunk_size=16"), expected), kLossTolerance);
  // A YAML that disagrees with config.json is one positioned error naming both.
  std::string refused;
  EXPECT_EQ(run_command(testing::tessera_binary() + " validate " +
                            spec("uncapped", model_yaml("gemma3_text", softcapped, ", attn_logit_softcapping: 0"), tokens),
                        refused),
            2)
      << refused;
  EXPECT_NE(refused.find("attn_logit_softcapping: 2"), std::string::npos) << refused;

  // Three steps on one rank accumulating two micro-batches, and on two ranks: under tp 2 (with
  // sequence parallelism too), pp 2 (the pipeline's two micro-batches) and fsdp over 2 ranks (one
  // micro-batch each).
  double one_rank = NAN;
  const std::string fsdp = "parallelism.dp_shard=2 --set components.parallel.component_key=parallel --set "
                           "components.parallel.variant_key=fsdp --set trainer.grad_accum=1";
  for (const std::string mesh : {std::string(), std::string("parallelism.tp=2"),
                                 std::string("parallelism.tp=2 --set parallelism.sequence_parallel=true"),
                                 std::string("parallelism.pp=2"), fsdp}) {
    SCOPED_TRACE(mesh);
    const std::string name = mesh.empty() ? "one-rank" : "mesh" + std::to_string(mesh.size());
    const std::string path = spec(name, model_yaml("gemma3_text", gemma), tokens);
    const std::string train = " train " + path + " --set checkpoint.export_format=hf --set trainer.grad_accum=2";
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() +
                              (mesh.empty() ? train : " launch --nproc-per-node 2 --" + train + " --set " + mesh),
                          out),
              0)
        << out;
    const double exported = reference_loss(dir_.file("runs/" + name + "/exports/step_00000003"), tokens, "--strict");
    if (mesh.empty()) {
      one_rank = exported;
      EXPECT_LT(relative(tessera_eval(path, "--resume auto"), exported), kLossTolerance);
      EXPECT_GT(relative(exported, expected), 1e-3) << "training changed nothing";
    } else {
      EXPECT_LT(relative(exported, one_rank), 1e-5) << mesh << " against one rank";
    }
  }
  // Context parallelism refuses the sliding window, as for the Qwens.
  EXPECT_EQ(run_command(testing::tessera_binary() + " validate " + spec("cp", model_yaml("gemma3_text", gemma), tokens) +
                            " --set parallelism.cp=2",
                        refused),
            2)
      << refused;
  EXPECT_NE(refused.find("window"), std::string::npos) << refused;
}

}  // namespace gemma3_interop_test
}  // namespace tessera
