// Tensor, context and expert parallelism end to end, through `tessera launch` on Gloo ranks:
// every mesh trains as one rank with as much accumulation does (per-step loss and grad norm, with
// clipping and accumulation), for gpt, llama and gpt_moe, with packed documents under context
// parallelism; with dropout a run is repeatable and resumes bit-exactly; checkpoints reshard
// across meshes; a tensor-parallel rank holds about half the parameters; expert parallelism routes
// as data-parallel ranks do; a vocabulary tp does not divide is padded on each rank and trains,
// saves and reshards as one rank's; and every mesh the model cannot take is one positioned error
// at validation.
#include <cmath>
#include <filesystem>
#include <regex>
#include <string>

#include <ATen/ops/zeros.h>

#include <fstream>
#include <iterator>

#include "mesh_fixture.hpp"
#include "tessera/formats/safetensors.hpp"

namespace tessera {
namespace tensor_parallel_test {

namespace fs = std::filesystem;

// 10 steps of 2 micro-batches per data-parallel rank, clipping at 0.5 (tiny_tp.yaml): the same
// loss and grad norm every step as one process, within float32 rounding; and the bytes the mesh's
// ranks held and moved are those `tessera plan` computes for it (every mesh of these tests and of
// pipeline_parallel_test.cpp).
TEST_P(Meshes, TrainAsOneRankWithAsMuchAccumulation) {
  const MeshCase c = GetParam();
  std::string one_log, log;
  ASSERT_EQ(train(1, c.model, c.model_sets + " --set trainer.grad_accum=" + std::to_string(2 * c.data_parallel), "one",
                  one_log),
            0)
      << one_log;
  ASSERT_EQ(train(c.ranks, c.model, c.model_sets + " " + c.sets, "mesh", log), 0) << log;
  const auto one = read_metrics(dir_.file("one") + "/metrics.jsonl");
  const auto mesh = read_metrics(dir_.file("mesh") + "/metrics.jsonl");
  ASSERT_EQ(one.size(), 10u);
  ASSERT_EQ(mesh.size(), 10u) << log;
  for (std::size_t i = 0; i < one.size(); ++i) {
    const double l1 = one[i]["loss"], lm = mesh[i]["loss"], g1 = one[i]["grad_norm"], gm = mesh[i]["grad_norm"];
    EXPECT_NEAR(lm, l1, 2e-5 * l1) << "step " << i + 1;
    EXPECT_NEAR(gm, g1, 1e-4 * g1) << "step " << i + 1;
    EXPECT_EQ(mesh[i]["tokens"], one[i]["tokens"]) << "step " << i + 1;
  }
  EXPECT_LT(double(mesh.back()["loss"]), double(mesh.front()["loss"])) << "it learns";
  // What the run held and moved is what `tessera plan` says a rank of this mesh does.
  plan_agrees_with_run(c.ranks, c.model, c.model_sets + " " + c.sets, mesh);
}

INSTANTIATE_TEST_SUITE_P(
    Parallelism, Meshes,
    ::testing::Values(MeshCase{"gpt_tp2", "tiny_tp", 2, 1, "--set parallelism.tp=2"},
                      // A vocabulary tp does not divide: each rank holds 129 rows, the last one padding
                      // (against one rank's 257); with pad_vocab_to_multiple_of 8 each of llama's
                      // two heads holds 136 (one rank without it holds 257).
                      MeshCase{"gpt_tp2_vocab257", "tiny_tp", 2, 1, "--set parallelism.tp=2", kVocab257},
                      MeshCase{"llama_tp2_vocab257_pad8", "tiny_llama_tp", 2, 1,
                               "--set parallelism.tp=2 --set components.model.config.pad_vocab_to_multiple_of=8",
                               kVocab257},

                      MeshCase{"gpt_tp2_sp", "tiny_tp", 2, 1, "--set parallelism.tp=2 --set parallelism.sequence_parallel=true"},
                      MeshCase{"gpt_tp4", "tiny_tp", 4, 1, "--set parallelism.tp=4"},
                      MeshCase{"gpt_fsdp2_tp2", "tiny_tp", 4, 2, "--set parallelism.tp=2" + kFsdp},
                      MeshCase{"gpt_ddp2_tp2", "tiny_tp", 4, 2, "--set parallelism.tp=2" + kDdp},
                      MeshCase{"gpt_hybrid_fsdp", "tiny_tp", 4, 4, "--set parallelism.dp_replicate=2" + kFsdp},
                      MeshCase{"llama_tp2", "tiny_llama_tp", 2, 1, "--set parallelism.tp=2"},
                      MeshCase{"llama_tp2_sp", "tiny_llama_tp", 2, 1,
                               "--set parallelism.tp=2 --set parallelism.sequence_parallel=true"},
                      MeshCase{"llama_tp4", "tiny_llama_tp", 4, 1, "--set parallelism.tp=4",
                               "--set components.model.config.n_kv_head=4"},
                      MeshCase{"llama_fsdp2_tp2", "tiny_llama_tp", 4, 2, "--set parallelism.tp=2" + kFsdp},
                      MeshCase{"llama_ddp2_tp2", "tiny_llama_tp", 4, 2, "--set parallelism.tp=2" + kDdp},
                      // Context parallelism: ring and Ulysses, with and without packed documents.
                      MeshCase{"gpt_cp2_ring", "tiny_tp", 2, 1, "--set parallelism.cp=2"},
                      MeshCase{"gpt_cp2_ulysses", "tiny_tp", 2, 1, "--set parallelism.cp=2 --set parallelism.cp_type=ulysses"},
                      MeshCase{"gpt_cp2_ring_documents", "tiny_tp", 2, 1, "--set parallelism.cp=2", kDocuments},
                      MeshCase{"gpt_cp2_ulysses_documents", "tiny_tp", 2, 1,
                               "--set parallelism.cp=2 --set parallelism.cp_type=ulysses", kDocuments},
                      MeshCase{"llama_cp2_ring", "tiny_llama_tp", 2, 1, "--set parallelism.cp=2"},
                      MeshCase{"llama_cp2_ulysses", "tiny_llama_tp", 2, 1,
                               "--set parallelism.cp=2 --set parallelism.cp_type=ulysses"},
                      MeshCase{"llama_cp2_ring_documents", "tiny_llama_tp", 2, 1, "--set parallelism.cp=2", kDocuments},
                      MeshCase{"llama_cp2_ulysses_documents", "tiny_llama_tp", 2, 1,
                               "--set parallelism.cp=2 --set parallelism.cp_type=ulysses", kDocuments},
                      MeshCase{"gpt_fsdp2_cp2", "tiny_tp", 4, 2, "--set parallelism.cp=2" + kFsdp},
                      MeshCase{"llama_fsdp2_cp2_ulysses", "tiny_llama_tp", 4, 2,
                               "--set parallelism.cp=2 --set parallelism.cp_type=ulysses" + kFsdp},
                      MeshCase{"llama_cp2_tp2_sp", "tiny_llama_tp", 4, 1,
                               "--set parallelism.cp=2 --set parallelism.tp=2 --set parallelism.sequence_parallel=true"},
                      // Expert parallelism: the experts split over ranks borrowed from the
                      // data-parallel ones; their gradients summed over the ranks with the same.
                      MeshCase{"moe_ep2", "tiny_moe_ep", 2, 2, "--set parallelism.ep=2"},
                      MeshCase{"moe_fsdp4_ep2", "tiny_moe_ep", 4, 4, "--set parallelism.ep=2" + kFsdp},
                      MeshCase{"moe_ddp4_ep4", "tiny_moe_ep", 4, 4, "--set parallelism.ep=4" + kDdp},
                      MeshCase{"moe_tp2_ep2", "tiny_moe_ep", 4, 2, "--set parallelism.tp=2 --set parallelism.ep=2"},
                      MeshCase{"moe_cp2_ep2", "tiny_moe_ep", 4, 2, "--set parallelism.cp=2 --set parallelism.ep=2" + kFsdp},
                      // The Qwens: llama's blocks with q/k/v biases and a sliding window on the second block
                      // (qwen2); per-head q/k norms, head_dim 12 and attention biases (qwen3).
                      MeshCase{"qwen2_tp2", "tiny_llama_tp", 2, 1, "--set parallelism.tp=2", kQwen2},
                      MeshCase{"qwen3_tp2_sp", "tiny_llama_tp", 2, 1,
                               "--set parallelism.tp=2 --set parallelism.sequence_parallel=true", kQwen3},
                      MeshCase{"qwen3_cp2_ulysses", "tiny_llama_tp", 2, 1,
                               "--set parallelism.cp=2 --set parallelism.cp_type=ulysses", kQwen3},
                      MeshCase{"qwen3_fsdp2", "tiny_llama_tp", 2, 2, kFsdp, kQwen3},
                      MeshCase{"qwen3_pp2", "tiny_llama_tp", 2, 1, "--set parallelism.pp=2", kQwen3},
                      MeshCase{"qwen3_moe_ep2", "tiny_llama_tp", 2, 2, "--set parallelism.ep=2", kQwen3Moe},
                      MeshCase{"qwen3_moe_fsdp2_ep2", "tiny_llama_tp", 2, 2, "--set parallelism.ep=2" + kFsdp, kQwen3Moe},
                      MeshCase{"qwen3_moe_tp2", "tiny_llama_tp", 2, 1, "--set parallelism.tp=2", kQwen3Moe},
                      // DeepSeek-V3: latent attention, a dense first block, grouped sigmoid routing with
                      // shared experts and the routing bias moved from the step's loads.
                      MeshCase{"deepseek_tp2", "tiny_deepseek", 2, 1, "--set parallelism.tp=2"},
                      MeshCase{"deepseek_ep2", "tiny_deepseek", 2, 2, "--set parallelism.ep=2"},
                      MeshCase{"deepseek_pp2", "tiny_deepseek", 2, 1, "--set parallelism.pp=2"},
                      MeshCase{"deepseek_cp2_ring", "tiny_deepseek", 2, 1, "--set parallelism.cp=2"},
                      MeshCase{"deepseek_fsdp2", "tiny_deepseek", 2, 2, kFsdp},
                      // Mixtral: llama's blocks with SwiGLU experts.
                      MeshCase{"mixtral_ep2", "tiny_llama_tp", 2, 2, "--set parallelism.ep=2", kMixtral},
                      MeshCase{"mixtral_fsdp2_tp2_ep2", "tiny_llama_tp", 4, 2,
                               "--set parallelism.tp=2 --set parallelism.ep=2" + kFsdp, kMixtral}),
    [](const ::testing::TestParamInfo<MeshCase>& info) { return info.param.name; });

// With dropout (the replicated stream's masks the same on both ranks, the heads' and the sequence
// slices' their own): two runs give the same losses, and a run resumed from step 5 gives the
// uninterrupted run's losses to the last bit.
TEST_F(TensorParallel, WithDropoutRunsRepeatAndResumeBitExactly) {
  for (const std::string sp : {"false", "true"}) {
    SCOPED_TRACE("sequence_parallel " + sp);
    const std::string args = "--set components.model.config.dropout=0.1 --set parallelism.tp=2 "
                             "--set parallelism.sequence_parallel=" + sp;
    std::vector<nlohmann::json> first;
    repeats_and_resumes_bit_exactly(args, sp, first);
  }
  // Dropout did something: the run without it has other losses.
  std::string out;
  ASSERT_EQ(train(2, "tiny_tp", "--set parallelism.tp=2", "plain", out), 0) << out;
  EXPECT_NE(double(read_metrics(dir_.file("plain") + "/metrics.jsonl").back()["loss"]),
            double(read_metrics(dir_.file("afalse") + "/metrics.jsonl").back()["loss"]));
}

// The quickstart GPT (configs/quickstart.yaml) with a vocabulary of 257 on 2 ranks under tp 2 (129
// rows each, the last one padding) takes one rank's per-step losses, and its sample_text draws
// from the gathered logits without the padding.
TEST_F(TensorParallel, TheQuickstartWithAnOddVocabularyTrainsUnderTp2AsOneRank) {
  const std::string quickstart = "train " + testing::source_dir() + "/configs/quickstart.yaml" + data_set() +
                                 " --set 'plugins.paths=[" + testing::plugin_dir() + "]'" + kVocab257 +
                                 " --set trainer.max_steps=6 --set components.scheduler.config.warmup_steps=2"
                                 " --set components.callbacks.2.config.max_new_tokens=16 --run-dir ";
  std::string out;
  ASSERT_EQ(run_command(tessera(quickstart + dir_.file("one")), out), 0) << out;
  ASSERT_EQ(run_command(tessera("launch --nproc-per-node 2 -- " + quickstart + dir_.file("tp2") + " --set parallelism.tp=2"),
                        out),
            0)
      << out;
  const auto one = read_metrics(dir_.file("one") + "/metrics.jsonl");
  const auto tp2 = read_metrics(dir_.file("tp2") + "/metrics.jsonl");
  ASSERT_EQ(one.size(), 6u);
  ASSERT_EQ(tp2.size(), 6u) << out;
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(double(tp2[i]["loss"]), double(one[i]["loss"]), 1e-4 * double(one[i]["loss"])) << "step " << i + 1;
  }
  EXPECT_TRUE(fs::exists(dir_.file("tp2") + "/samples.txt")) << "sample_text drew under tp 2: " << out;
}

// Saved under one mesh, resumed under another: the steps after the checkpoint are the
// uninterrupted run's (whole parameters and optimizer state in the checkpoint, cut again).
TEST_F(TensorParallel, CheckpointsReshardAcrossMeshes) {
  const Reshard cases[] = {
      {"tp2_to_1", 2, "--set parallelism.tp=2", 1, ""},
      {"1_to_tp4", 1, "", 4, "--set parallelism.tp=4"},
      // A padded vocabulary: the checkpoint holds the true 257 rows, each mesh pads its own (one
      // rank's padded to 320 rows by pad_vocab_to_multiple_of 64, resumed as tp 2's 129 each).
      {"vocab257_tp2_to_tp4", 2, "--set parallelism.tp=2" + kVocab257, 4, "--set parallelism.tp=4" + kVocab257},
      {"vocab257_pad64_to_tp2", 1, "--set components.model.config.pad_vocab_to_multiple_of=64" + kVocab257, 2,
       "--set parallelism.tp=2" + kVocab257},
      // The same global batch: 2 data-parallel ranks of 2 micro-batches, then 4 of 1.
      {"fsdp2_tp2_to_fsdp4", 4, "--set parallelism.tp=2" + kFsdp, 4, "--set trainer.grad_accum=1" + kFsdp},
      {"cp2_to_1", 2, "--set parallelism.cp=2", 1, ""},
      {"fsdp2_cp2_to_fsdp2", 4, "--set parallelism.cp=2" + kFsdp, 2, kFsdp},
      // Each expert-parallel rank's experts are joined into whole expert stacks, and cut again.
      {"fsdp4_ep2_to_1", 4, "--set trainer.grad_accum=1 --set parallelism.ep=2" + kFsdp, 1, "--set trainer.grad_accum=4",
       "tiny_moe_ep"},
      {"1_to_fsdp4_ep4", 1, "--set trainer.grad_accum=4", 4, "--set trainer.grad_accum=1 --set parallelism.ep=4" + kFsdp,
       "tiny_moe_ep"},
      // Experts whole on both tensor-parallel ranks: their state written once.
      {"tp2_ep2_to_1", 4, "--set parallelism.tp=2 --set parallelism.ep=2", 1, "--set trainer.grad_accum=4", "tiny_moe_ep"},
  };
  for (const Reshard& r : cases) resumes_as_saved(r);
}

// init_from a Tessera export: each tensor-parallel rank takes its part of every tensor, and the
// run continues as one rank starting from the export does.
TEST_F(TensorParallel, InitFromATesseraExportCutsItsTensorsForEachRank) {
  std::string out;
  ASSERT_EQ(train(1, "tiny_tp", "--set trainer.max_steps=4 --set checkpoint.export_at_end=true", "source", out), 0) << out;
  const std::string exported = dir_.file("source") + "/exports/step_00000004";
  ASSERT_TRUE(fs::exists(exported + "/model.safetensors")) << out;
  const std::string from = " --set components.model.config.init_from=" + exported + " --set trainer.max_steps=4";
  ASSERT_EQ(train(1, "tiny_tp", from, "one", out), 0) << out;
  ASSERT_EQ(train(2, "tiny_tp", from + " --set parallelism.tp=2", "tp2", out), 0) << out;
  const auto one = read_metrics(dir_.file("one") + "/metrics.jsonl");
  const auto tp2 = read_metrics(dir_.file("tp2") + "/metrics.jsonl");
  const auto source = read_metrics(dir_.file("source") + "/metrics.jsonl");
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(tp2.size(), 4u);
  EXPECT_LT(double(one.front()["loss"]), double(source.front()["loss"])) << "it starts from the trained weights";
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(double(tp2[i]["loss"]), double(one[i]["loss"]), 2e-5 * double(one[i]["loss"])) << "step " << i + 1;
  }
}

// Every rank's largest model state is reported at step 1: a tensor-parallel rank of 2 holds about
// half of one rank's parameters and optimizer state (the norms and some biases stay whole).
TEST_F(TensorParallel, ModelStateBytesPerRankFallWithTp) {
  std::string out;
  const std::string short_run = "--set trainer.max_steps=2 --set components.scheduler.config.warmup_steps=1";
  ASSERT_EQ(train(1, "tiny_tp", short_run, "one", out), 0) << out;
  ASSERT_EQ(train(2, "tiny_tp", short_run + " --set parallelism.tp=2", "tp2", out), 0) << out;
  const auto one = read_metrics(dir_.file("one") + "/metrics.jsonl").front();
  const auto tp2 = read_metrics(dir_.file("tp2") + "/metrics.jsonl").front();
  for (const char* key : {"parameter_bytes", "gradient_bytes", "optimizer_bytes"}) {
    ASSERT_TRUE(one.contains(key)) << key;
    ASSERT_TRUE(tp2.contains(key)) << key;
  }
  const double p1 = one["parameter_bytes"], p2 = tp2["parameter_bytes"];
  EXPECT_GT(p2, 0.45 * p1);
  EXPECT_LT(p2, 0.6 * p1) << "tp 2 holds " << p2 << " B of parameters, one rank " << p1;
  EXPECT_LT(double(tp2["optimizer_bytes"]), 0.6 * double(one["optimizer_bytes"]));
  EXPECT_FALSE(read_metrics(dir_.file("tp2") + "/metrics.jsonl").back().contains("parameter_bytes")) << "step 1 only";
}

// With the routing a user trains with (capacity 1.25, load-balancing and z-losses, whose batch
// statistics are each rank's own), expert parallelism changes where experts run, not what they
// compute: on the same 2 ranks, ep 2 gives plain ddp's losses and exactly its per-expert loads and
// drops, each rank holds its half of the experts (fewer parameter bytes, tokens on the wire
// instead), and a run resumed from step 5 repeats the uninterrupted one to the last bit.
TEST_F(TensorParallel, ExpertParallelRanksRouteAsDataParallelRanksDo) {
  const std::string routing = "--set components.model.config.capacity_factor=1.25 "
                              "--set components.model.config.aux_loss_coef=0.01 --set components.model.config.z_loss_coef=0.001 ";
  std::string out;
  ASSERT_EQ(train(2, "tiny_moe_ep", routing + kDdp, "ddp", out), 0) << out;
  ASSERT_EQ(train(2, "tiny_moe_ep", routing + "--set parallelism.ep=2 --set checkpoint.every_steps=5", "ep", out), 0) << out;
  ASSERT_EQ(train(2, "tiny_moe_ep", routing + "--set parallelism.ep=2 --resume " + dir_.file("ep") + "/checkpoints/step_00000005",
                  "resumed", out),
            0)
      << out;
  const auto ddp = read_metrics(dir_.file("ddp") + "/metrics.jsonl");
  const auto ep = read_metrics(dir_.file("ep") + "/metrics.jsonl");
  const auto resumed = read_metrics(dir_.file("resumed") + "/metrics.jsonl");
  ASSERT_EQ(ddp.size(), 10u);
  ASSERT_EQ(ep.size(), 10u);
  ASSERT_EQ(resumed.size(), 5u) << out;
  int loads = 0;
  for (std::size_t i = 0; i < ep.size(); ++i) {
    EXPECT_NEAR(double(ep[i]["loss"]), double(ddp[i]["loss"]), 2e-5 * double(ddp[i]["loss"])) << "step " << i + 1;
    for (const auto& [key, value] : ddp[i].items()) {
      if (key.find("_fraction") == std::string::npos) continue;  // expertN_fraction, dropped_fraction
      ASSERT_TRUE(ep[i].contains(key)) << key;
      EXPECT_EQ(double(ep[i][key]), double(value)) << key << " at step " << i + 1;
      ++loads;
    }
  }
  EXPECT_EQ(loads, 10 * 2 * 5) << "2 layers of 4 expert loads and a dropped fraction, every step";
  EXPECT_GT(double(ddp.back()["moe/layer0/dropped_fraction"]) + double(ddp.back()["moe/layer1/dropped_fraction"]) +
                double(ddp[4]["moe/layer0/dropped_fraction"]) + double(ddp[4]["moe/layer1/dropped_fraction"]),
            0.0)
      << "the capacity dropped some tokens";
  EXPECT_LT(double(ep.front()["parameter_bytes"]), 0.8 * double(ddp.front()["parameter_bytes"]));
  // Tokens travel over the expert-parallel group (counted apart); the gradients reduced over the
  // data-parallel ranks are the others', not the experts' (no other rank holds the same ones).
  ASSERT_TRUE(ep.front().contains("communicated_bytes/ep")) << ep.front().dump();
  EXPECT_GT(double(ep.front()["communicated_bytes/ep"]), 0);
  EXPECT_FALSE(ddp.front().contains("communicated_bytes/ep"));
  EXPECT_LT(double(ep.front()["communicated_bytes/world"]), 0.8 * double(ddp.front()["communicated_bytes"]));
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(double(resumed[i]["loss"]), double(ep[i + 5]["loss"])) << "step " << i + 6;
  }
}

// What a mesh cannot do is refused before anything is built: one line with the spec's position,
// exit 2.
TEST_F(TensorParallel, MeshesTheRunCannotTakeArePositionedErrors) {
  const Bad cases[] = {
      {"tiny_tp", "--set parallelism.tp=3", "n_head (4) must be divisible by parallelism.tp (3)"},
      {"tiny_llama_tp", "--set parallelism.tp=4", "n_kv_head (2) must be divisible by parallelism.tp (4)"},
      {"tiny_llama_tp", "--set parallelism.tp=2 --set components.model.config.intermediate_size=65",
       "intermediate_size (65) must be divisible by parallelism.tp (2)"},
      {"tiny_tp", "--set parallelism.sequence_parallel=true", "sequence_parallel: needs tp > 1"},
      {"tiny_tp", "--set parallelism.tp=2 --set parallelism.sequence_parallel=true "
                  "--set components.train_data.config.seq_len=31 --set components.model.config.max_seq_len=31",
       "seq_len 31 does not split over the 2 tensor-parallel ranks of sequence parallelism"},
      {"tiny_tp", "--set parallelism.cp=2 --set components.train_data.config.seq_len=30 "
                  "--set components.model.config.max_seq_len=30",
       "seq_len 30 does not split into the 2 x cp (4) chunks of context parallelism"},
      {"tiny_tp", "--set parallelism.cp=2 --set parallelism.cp_type=ulysses --set parallelism.tp=4",
       "n_head (4) over tp 4 must be divisible by parallelism.cp (2) for ulysses attention"},
      {"tiny_llama_tp", "--set parallelism.cp=2 --set components.model.config.dropout=0.1",
       "attention across context-parallel slices has no dropout"},
      {"tiny_llama_tp", kQwen2 + " --set parallelism.cp=2",
       "sliding_window 8 with parallelism.cp 2: context-parallel attention covers the whole causal past"},
      {"tiny_moe_ep", "--set parallelism.ep=4 --set parallelism.dp_shard=2", "ep 4 borrows its ranks from dp_shard (2), which it must divide"},
      {"tiny_moe_ep", "--set parallelism.ep=2 --set parallelism.dp_shard=2 --set components.model.config.num_experts=3",
       "num_experts (3) must be divisible by parallelism.ep (2)"},
      {"tiny_moe_ep", "--set parallelism.ep=2 --set parallelism.dp_shard=2 --set parallelism.dp_replicate=2",
       "expert parallelism with dp_replicate 2 (hybrid sharding) is not available yet"},
      {"tiny_tp", "--set parallelism.ep=2 --set parallelism.dp_shard=2",
       "model/gpt does not split experts over expert-parallel ranks, but parallelism.ep is 2"},
      {"tiny_llama_tp", "--set parallelism.ep=2", "parallelism.ep is 2 but this llama is dense; set num_experts"},
      {"tiny_llama_tp", "--set parallelism.ep=4 --set components.model.config.num_experts=6",
       "num_experts (6) must be divisible by parallelism.ep (4)"},
      {"tiny_llama_tp", "--set parallelism.tp=2 --set parallelism.sequence_parallel=true " + kMixtral,
       "the experts route whole sequences, not tensor-parallel slices of them"},
  };
  for (const Bad& c : cases) is_a_positioned_validate_error(c);
  // gpt_moe runs its experts on whole sequences.
  std::string out;
  EXPECT_EQ(run_command(tessera("validate " + config("tiny_tp") + data_set() +
                                " --set parallelism.tp=2 --set parallelism.sequence_parallel=true"
                                " --set components.model.variant_key=gpt_moe"),
                        out),
            2)
      << out;
  EXPECT_NE(out.find("parallelism.sequence_parallel: model/gpt_moe does not run its layers on sequence slices"),
            std::string::npos)
      << out;
  // A mesh of 2 ranks trained by a process alone.
  EXPECT_EQ(train(1, "tiny_tp", "--set parallelism.tp=2", "alone", out), 2) << out;
  EXPECT_NE(out.find("parallelism: the mesh tp 2 needs 2 ranks but this run has 1"), std::string::npos) << out;
  // A mesh whose product is not the number of ranks launched.
  EXPECT_EQ(train(2, "tiny_tp", "--set parallelism.tp=2 --set parallelism.dp_shard=2", "wrong", out), 2) << out;
  EXPECT_NE(out.find("the mesh dp_shard 2 x tp 2 has 4 ranks but this run has 2"), std::string::npos) << out;
}

// With init_from the sizes come from its config.json (a Hugging Face or Tessera export folder) or
// the YAML (a safetensors file); validate settles them as train does and refuses every mesh train
// refuses, one rule at a time, without reading a weight (the folders below hold none).
TEST_F(TensorParallel, MeshChecksHoldUnderInitFrom) {
  const auto folder = [&](const std::string& name, const std::string& config_json) {
    dir_.write(name + "/config.json", config_json);
    return dir_.file(name);
  };
  const std::string gpt2 = folder("gpt2", R"({"model_type": "gpt2", "vocab_size": 256, "n_layer": 2, "n_head": 2,
                                              "n_embd": 32, "n_positions": 32, "activation_function": "gelu"})");
  const std::string gpt2_odd = folder("gpt2_odd", R"({"model_type": "gpt2", "vocab_size": 255, "n_layer": 2,
                                                      "n_head": 4, "n_embd": 32, "n_positions": 32})");
  const std::string exported = folder("export", R"({"component_key": "model", "variant_key": "gpt",
                                                    "config": {"vocab_size": 256, "n_layer": 1, "n_head": 4,
                                                               "n_embd": 32, "max_seq_len": 32}})");
  const std::string llama = folder("llama", R"({"model_type": "llama", "vocab_size": 256, "num_hidden_layers": 2,
                                                "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32,
                                                "intermediate_size": 65, "max_position_embeddings": 32})");
  const std::string mixtral = folder("mixtral", R"({"model_type": "mixtral", "vocab_size": 256, "num_hidden_layers": 2,
                                                    "num_attention_heads": 4, "num_key_value_heads": 2,
                                                    "hidden_size": 32, "intermediate_size": 64,
                                                    "max_position_embeddings": 32, "num_local_experts": 3})");
  const std::string weights = dir_.file("gpt.safetensors");
  write_safetensors(weights, {{"wte.weight", at::zeros({256, 32})}});
  // tiny_tp (or tiny_llama_tp) with its model's config replaced by `model`.
  const auto spec = [&](const std::string& base, const std::string& name, const std::string& variant,
                        const std::string& model) {
    std::ifstream in(config(base));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t from = text.find("  model:"), to = text.find("  train_data:");
    text.replace(from, to - from, "  model: {component_key: model, variant_key: " + variant + ", config: " + model + "}\n");
    return dir_.write(name + ".yaml", text);
  };
  struct Case {
    std::string spec, args, expected;
  };
  const Case cases[] = {
      // The issue's case: a Tessera safetensors file, the sizes the YAML's.
      {spec("tiny_tp", "file", "gpt",
            "{vocab_size: 256, n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 32, init_from: " + weights + "}"),
       "--set parallelism.tp=4", "n_head (2) must be divisible by parallelism.tp (4)"},
      {spec("tiny_tp", "gpt2", "gpt", "{init_from: " + gpt2 + "}"), "--set parallelism.tp=4",
       "n_head (2) must be divisible by parallelism.tp (4)"},
      {spec("tiny_tp", "gpt2_odd", "gpt", "{init_from: " + gpt2_odd + "}"), "--set parallelism.tp=3",
       "n_head (4) must be divisible by parallelism.tp (3)"},
      {spec("tiny_tp", "gpt2_ulysses", "gpt", "{init_from: " + gpt2 + "}"),
       "--set parallelism.tp=2 --set parallelism.cp=2 --set parallelism.cp_type=ulysses",
       "n_head (2) over tp 2 must be divisible by parallelism.cp (2) for ulysses attention"},
      {spec("tiny_tp", "export", "gpt", "{init_from: " + exported + "}"), "--set parallelism.pp=2",
       "2 pipeline stages (pp 2 x 1 per rank) for 1 blocks: every stage needs a block"},
      {spec("tiny_llama_tp", "llama_kv", "llama", "{init_from: " + llama + "}"), "--set parallelism.tp=4",
       "n_kv_head (2) must be divisible by parallelism.tp (4)"},
      {spec("tiny_llama_tp", "llama_mlp", "llama", "{init_from: " + llama + "}"), "--set parallelism.tp=2",
       "intermediate_size (65) must be divisible by parallelism.tp (2)"},
      {spec("tiny_llama_tp", "llama_dropout", "llama", "{dropout: 0.1, init_from: " + llama + "}"),
       "--set parallelism.cp=2", "attention across context-parallel slices has no dropout"},
      {spec("tiny_llama_tp", "llama_dense", "llama", "{init_from: " + llama + "}"), "--set parallelism.ep=2",
       "parallelism.ep is 2 but this llama is dense"},
      {spec("tiny_llama_tp", "mixtral", "llama", "{init_from: " + mixtral + "}"), "--set parallelism.ep=2",
       "num_experts (3) must be divisible by parallelism.ep (2)"},
  };
  std::string out;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec + " " + c.args);
    EXPECT_EQ(run_command(tessera("validate " + c.spec + data_set() + " " + c.args), out), 2) << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << out;
    EXPECT_TRUE(std::regex_search(out, std::regex(R"(error: [^\n]+:[0-9]+:[0-9]+: [a-z_.]+: )"))) << "positioned: " << out;
  }
  // The meshes these sizes do take validate.
  EXPECT_EQ(run_command(tessera("validate " + cases[1].spec + data_set() + " --set parallelism.tp=2"), out), 0) << out;
  EXPECT_EQ(run_command(tessera("validate " + cases[5].spec + data_set() + " --set parallelism.ep=1"), out), 0) << out;
  // GPT-2's odd vocabulary of init_from splits over tp 2: each rank holds it padded.
  EXPECT_EQ(run_command(tessera("validate " + cases[2].spec + data_set() + " --set parallelism.tp=2"), out), 0) << out;
  // And train refuses what validate refuses, with the same words.
  EXPECT_EQ(run_command(tessera("train " + cases[0].spec + data_set() + " --set parallelism.tp=4"), out), 2) << out;
  EXPECT_NE(out.find(cases[0].expected), std::string::npos) << out;
}

}  // namespace tensor_parallel_test
}  // namespace tessera
