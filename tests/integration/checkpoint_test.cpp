// Checkpoints through the real `tessera`: bit-exact resume (one rank, and two ranks with
// accumulation), crash safety (SIGKILL at every stage of a save), corruption found by checksum,
// resharding to other numbers of ranks, pruning, and model exports.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "cli_fixture.hpp"
#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/checkpoint/checkpoint_store.hpp"
#include "tessera/formats/safetensors.hpp"

namespace tessera {
namespace checkpoint_test {

namespace fs = std::filesystem;

class Checkpoints : public Cli {
 protected:
  // Runs `tessera train` on the tiny spec with this fixture's data (and a warmup short enough
  // for runs of a few steps); returns the exit code.
  int train(const std::string& args, std::string& out, const std::string& env = "") {
    return run_command(env + " " + tessera("train " + tiny() + data_set() + kShortWarmup + args), out);
  }
  int launch(int ranks, const std::string& args, std::string& out) {
    return run_command(tessera("launch --nproc-per-node " + std::to_string(ranks) + " -- train " + tiny() + data_set() +
                               kShortWarmup + " --set settings.collective_timeout_s=60 " + args),
                       out);
  }
  static constexpr const char* kShortWarmup = " --set components.scheduler.config.warmup_steps=2 ";
  static std::vector<double> losses(const std::string& run_dir) {
    std::vector<double> out;
    for (const auto& row : read_metrics(run_dir + "/metrics.jsonl")) out.push_back(row["loss"]);
    return out;
  }
  static StateDict model_at(const std::string& run_dir, std::int64_t step) {
    return read_safetensors(run_dir + "/checkpoints/" + core::CheckpointStore::name_of(step) + "/model.safetensors").tensors;
  }
  // 8 steps straight, against 4 steps and a resumed run to step 8, each with `extra`.
  void resume_on_one_rank(const std::string& extra);
  // The same with fsdp on two ranks with accumulation.
  void resume_on_two_ranks(const std::string& extra);
  static std::string strategy(const std::string& name) {
    return " --set components.parallel.component_key=parallel --set components.parallel.variant_key=" + name;
  }
};

void expect_identical(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(t.equal(b.at(name))) << name << " differs by " << t.sub(b.at(name)).abs().max().item<double>();
  }
}

// 8 steps straight, against 4 steps (stopped by max_tokens, so the schedule, which follows
// max_steps, is the same), a save at the stop, and a resumed run to step 8.
TEST_F(Checkpoints, ResumeIsBitExactOnOneRank) { resume_on_one_rank(""); }

// The compute plane's options together: batches read ahead by 3 (the checkpoint must record the
// first batch not yet used, not the last one read), bf16 autocast, logits chunk by chunk and
// blocks recomputed in backward.
TEST_F(Checkpoints, ResumeIsBitExactWithPrefetchBf16ChunkedLossAndActivationCheckpointing) {
  resume_on_one_rank(
      " --set trainer.prefetch=3 --set settings.precision=bf16 --set components.loss.config.chunk_size=24"
             " --set components.model.config.activation_checkpointing=true");
}

void Checkpoints::resume_on_one_rank(const std::string& extra) {
  const std::string common = "--set trainer.max_steps=8 --set checkpoint.export_at_end=false" + extra;
  std::string out;
  ASSERT_EQ(train(common + " --run-dir " + dir_.file("straight"), out), 0) << out;
  // 512 tokens per step: 8 sequences of 32, 2 micro-batches.
  ASSERT_EQ(train(common + " --set trainer.max_tokens=2048 --run-dir " + dir_.file("split"), out), 0) << out;
  EXPECT_TRUE(fs::exists(dir_.file("split") + "/checkpoints/step_00000004/metadata.json")) << out;
  ASSERT_EQ(train(common + " --run-dir " + dir_.file("split") + " --resume auto", out), 0) << out;
  EXPECT_NE(out.find("resumed from " + dir_.file("split") + "/checkpoints/step_00000004 at step 4"), std::string::npos)
      << out;
  const auto straight = losses(dir_.file("straight")), split = losses(dir_.file("split"));
  ASSERT_EQ(straight.size(), 8u);
  ASSERT_EQ(split.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(split[i], straight[i]) << "step " << i + 1;
  expect_identical(model_at(dir_.file("split"), 8), model_at(dir_.file("straight"), 8));
  const auto opt = [&](const std::string& run) {
    return read_safetensors(run + "/checkpoints/step_00000008/rank_00000/optimizer.safetensors").tensors;
  };
  expect_identical(opt(dir_.file("split")), opt(dir_.file("straight")));
}

TEST_F(Checkpoints, ResumeIsBitExactOnTwoRanksWithAccumulationAndShardedState) { resume_on_two_ranks(""); }

// Dropout draws from the generators every step: the checkpoint's RNG state must put them back
// exactly, on one rank and on two. (The dropout is real: without it the losses differ.)
TEST_F(Checkpoints, ResumeIsBitExactWithDropout) {
  resume_on_one_rank(" --set components.model.config.dropout=0.2");
  std::string out;
  ASSERT_EQ(train("--set trainer.max_steps=8 --set checkpoint.export_at_end=false --run-dir " + dir_.file("no-dropout"), out),
            0)
      << out;
  EXPECT_NE(losses(dir_.file("no-dropout"))[1], losses(dir_.file("straight"))[1]);
}

TEST_F(Checkpoints, ResumeIsBitExactOnTwoRanksWithDropout) {
  resume_on_two_ranks(" --set components.model.config.dropout=0.2");
}

// fsdp's mixed-precision policy under bf16 compute: parameters gathered and gradients reduced in
// bf16; the checkpoint holds the float32 master weights, so the resumed run continues exactly.
TEST_F(Checkpoints, ResumeIsBitExactOnTwoRanksWithBf16GatherAndReduce) {
  resume_on_two_ranks(" --set settings.precision=bf16 --set components.parallel.config.param_dtype=bf16"
                      " --set components.parallel.config.reduce_dtype=bf16");
}

void Checkpoints::resume_on_two_ranks(const std::string& extra) {
  const std::string common = "--set trainer.max_steps=8 --set checkpoint.export_at_end=false" + strategy("fsdp") + extra;
  std::string out;
  ASSERT_EQ(launch(2, common + " --run-dir " + dir_.file("straight"), out), 0) << out;
  ASSERT_EQ(launch(2, common + " --set trainer.max_tokens=4096 --run-dir " + dir_.file("split"), out), 0) << out;
  const std::string saved = dir_.file("split") + "/checkpoints/step_00000004";
  EXPECT_TRUE(fs::exists(saved + "/rank_00001/optimizer.safetensors")) << "fsdp shards the optimizer state";
  ASSERT_EQ(launch(2, common + " --run-dir " + dir_.file("split") + " --resume auto", out), 0) << out;
  const auto straight = losses(dir_.file("straight")), split = losses(dir_.file("split"));
  ASSERT_EQ(split.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(split[i], straight[i]) << "step " << i + 1;
  expect_identical(model_at(dir_.file("split"), 8), model_at(dir_.file("straight"), 8));
}

// Saved by 2 ranks with a sharding strategy, resumed by 1 (same strategy) and by 3 (another
// strategy) with the same global batch: the losses continue those of the uninterrupted run.
class Reshard : public Checkpoints, public ::testing::WithParamInterface<std::string> {};

TEST_P(Reshard, SavedOnTwoRanksResumesOnOneAndThree) {
  const std::string common = "--set trainer.max_steps=8 --set checkpoint.export_at_end=false --set trainer.micro_batch_size=4" +
                             strategy(GetParam());
  std::string out;
  // Global batch: 6 micro-batches of 4 (2 ranks x 3, 1 x 6, 3 x 2); 4 x 32 x 6 = 768 tokens a step.
  ASSERT_EQ(launch(2, common + " --set trainer.grad_accum=3 --run-dir " + dir_.file("straight"), out), 0) << out;
  ASSERT_EQ(launch(2, common + " --set trainer.grad_accum=3 --set trainer.max_tokens=3072 --run-dir " + dir_.file("saved"), out), 0)
      << out;
  const std::string checkpoint = dir_.file("saved") + "/checkpoints/step_00000004";
  ASSERT_TRUE(fs::exists(checkpoint + "/metadata.json")) << out;
  ASSERT_EQ(train(common + " --set trainer.grad_accum=6 --resume " + checkpoint + " --run-dir " + dir_.file("one"), out), 0)
      << out;
  EXPECT_NE(out.find("(saved by 2 ranks with " + GetParam() + "; now 1 rank)"), std::string::npos) << out;
  // Three ranks with another strategy: the layout and the strategy change together.
  const std::string other = GetParam() == "zero2" ? "fsdp" : "ddp";
  ASSERT_EQ(launch(3, common + " --set trainer.grad_accum=2 --set components.parallel.variant_key=" + other +
                          " --resume " + checkpoint + " --run-dir " + dir_.file("three"), out), 0)
      << out;
  EXPECT_NE(out.find("parallel/" + other + ": "), std::string::npos) << out;
  const auto straight = losses(dir_.file("straight"));
  for (const char* run : {"one", "three"}) {
    const auto resumed = losses(dir_.file(run));
    ASSERT_EQ(resumed.size(), 4u) << run;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_NEAR(resumed[i], straight[i + 4], 1e-5 * straight[i + 4]) << run << " step " << i + 5;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, Reshard, ::testing::Values("zero2", "fsdp"));

// SIGKILL at each stage of a save (the writer thread runs in the background), then: every
// complete checkpoint verifies, `latest` names a valid one, and --resume auto finishes the run
// from the newest valid checkpoint with the losses and weights of a run that was never killed.
struct CrashCase {
  std::string failpoint;
  std::int64_t resumes_at;
};
void PrintTo(const CrashCase& c, std::ostream* os) { *os << c.failpoint; }

class CrashDuringSave : public Checkpoints, public ::testing::WithParamInterface<CrashCase> {};

TEST_P(CrashDuringSave, LeavesOnlyValidCheckpointsAndResumes) {
  const std::string common = "--set trainer.max_steps=8 --set checkpoint.every_steps=2 --set checkpoint.keep_last=1" +
                             std::string(" --set checkpoint.export_at_end=false --run-dir ") + dir_.file("run");
  std::string out;
  EXPECT_NE(train(common, out, "TESSERA_FAILPOINT=" + GetParam().failpoint), 0) << out;
  EXPECT_NE(out.find("failpoint"), std::string::npos) << out;
  const std::string checkpoints = dir_.file("run") + "/checkpoints";
  int complete = 0;
  for (const auto& entry : fs::directory_iterator(checkpoints)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.find(".tmp") != std::string::npos) continue;
    EXPECT_NO_THROW(core::verify_checkpoint(entry.path().string())) << name;
    ++complete;
  }
  EXPECT_GE(complete, 1);
  std::ifstream latest(checkpoints + "/latest");
  std::string name;
  latest >> name;
  EXPECT_NO_THROW(core::verify_checkpoint(checkpoints + "/" + name)) << "latest names " << name;

  ASSERT_EQ(train(common + " --resume auto", out), 0) << out;
  const std::int64_t at = GetParam().resumes_at;
  EXPECT_NE(out.find("at step " + std::to_string(at) + " "), std::string::npos) << out;
  EXPECT_EQ(read_metrics(dir_.file("run") + "/metrics.jsonl").back()["step"], 8);
  EXPECT_FALSE(fs::exists(checkpoints + "/step_00000004.tmp")) << "the next start removes interrupted saves";

  const std::string straight = "--set trainer.max_steps=8 --set checkpoint.every_steps=2 --set checkpoint.keep_last=1"
                               " --set checkpoint.export_at_end=false --run-dir " + dir_.file("straight");
  ASSERT_EQ(train(straight, out), 0) << out;
  const auto expected = losses(dir_.file("straight")), resumed = losses(dir_.file("run"));
  ASSERT_GE(resumed.size(), static_cast<std::size_t>(8 - at));
  for (std::int64_t i = 0; i < 8 - at; ++i) {
    // The resumed run's rows are the last 8 - at of metrics.jsonl.
    EXPECT_EQ(resumed[resumed.size() - static_cast<std::size_t>(8 - at - i)], expected[static_cast<std::size_t>(at + i)])
        << "step " << at + i + 1;
  }
  expect_identical(model_at(dir_.file("run"), 8), model_at(dir_.file("straight"), 8));
}

INSTANTIATE_TEST_SUITE_P(
    Failpoints, CrashDuringSave,
    ::testing::Values(CrashCase{"checkpoint.after_model@2", 2}, CrashCase{"checkpoint.before_manifest@2", 2},
                      CrashCase{"checkpoint.before_rename@2", 2}, CrashCase{"checkpoint.after_rename@2", 4},
                      CrashCase{"checkpoint.before_prune@1", 4}),
    [](const ::testing::TestParamInfo<CrashCase>& info) {
      std::string n = info.param.failpoint.substr(11);
      for (auto& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return n;
    });

// An I/O error (disk full, EIO) injected at each step of the second save (write, fsync, the
// manifest's rename, the metadata, the folder's rename, the `latest` pointer; see
// TESSERA_IO_FAULT in sdk/src/formats/durable_file.cpp): the run fails with one clear error, the
// previous checkpoint stays valid, no half checkpoint is taken by --resume auto, and the resumed
// run's losses and weights equal those of a run that never failed.
struct IoFaultCase {
  std::string name, fault, path_suffix;
  std::int64_t resumes_at;
};
void PrintTo(const IoFaultCase& c, std::ostream* os) { *os << c.name; }

class IoFaultDuringSave : public Checkpoints, public ::testing::WithParamInterface<IoFaultCase> {};

TEST_P(IoFaultDuringSave, FailsCleanlyAndResumesBitExact) {
  const IoFaultCase& c = GetParam();
  const std::string common = "--set trainer.max_steps=8 --set checkpoint.every_steps=2 --set checkpoint.keep_last=1" +
                             std::string(" --set checkpoint.export_at_end=false --run-dir ");
  std::string out;
  ASSERT_EQ(train(common + dir_.file("straight"), out), 0) << out;
  const std::string env = "TESSERA_IO_FAULT=" + c.fault + " TESSERA_IO_FAULT_PATH=" + c.path_suffix;
  EXPECT_EQ(train(common + dir_.file("run"), out, env), 1) << out;
  const std::string reason = c.fault.find("EIO") != std::string::npos ? "Input/output error" : "No space left on device";
  EXPECT_NE(out.find("the save of step 4 failed: "), std::string::npos) << out;
  EXPECT_NE(out.find(reason), std::string::npos) << out;
  EXPECT_EQ(out.find("frame #"), std::string::npos) << "one clear error, no backtrace: " << out;

  const std::string checkpoints = dir_.file("run") + "/checkpoints";
  EXPECT_NO_THROW(core::verify_checkpoint(checkpoints + "/step_00000002")) << "the previous checkpoint stays valid";
  const core::CheckpointStore store(checkpoints, dir_.file("run") + "/exports");
  EXPECT_EQ(fs::path(store.newest_valid()).filename().string(), core::CheckpointStore::name_of(c.resumes_at));

  ASSERT_EQ(train(common + dir_.file("run") + " --resume auto", out), 0) << out;
  EXPECT_NE(out.find("at step " + std::to_string(c.resumes_at) + " "), std::string::npos) << out;
  const auto straight = losses(dir_.file("straight"));
  const auto resumed = losses(dir_.file("run"));  // the failed run's rows, then the resumed run's
  ASSERT_GE(resumed.size(), 8u - static_cast<std::size_t>(c.resumes_at));
  for (std::size_t i = 0; i + c.resumes_at < 8; ++i) {
    EXPECT_EQ(resumed[resumed.size() - (8 - c.resumes_at) + i], straight[c.resumes_at + i]) << "step " << c.resumes_at + i + 1;
  }
  expect_identical(model_at(dir_.file("run"), 8), model_at(dir_.file("straight"), 8));
}

INSTANTIATE_TEST_SUITE_P(
    Faults, IoFaultDuringSave,
    ::testing::Values(IoFaultCase{"WriteModelDiskFull", "write", "step_00000004.tmp/model.safetensors", 2},
                      IoFaultCase{"FsyncOptimizerEio", "fsync:EIO", "step_00000004.tmp/rank_00000/optimizer.safetensors", 2},
                      IoFaultCase{"CreateManifestDiskFull", "create", "step_00000004.tmp/rank_00000/manifest.json.tmp", 2},
                      IoFaultCase{"RenameManifestEio", "rename:EIO", "step_00000004.tmp/rank_00000/manifest.json", 2},
                      IoFaultCase{"WriteMetadataDiskFull", "write", "step_00000004.tmp/metadata.json", 2},
                      IoFaultCase{"FsyncFolderEio", "fsync_dir:EIO", "step_00000004.tmp", 2},
                      IoFaultCase{"RenameFolderDiskFull", "rename", "checkpoints/step_00000004", 2},
                      // The checkpoint itself is complete: only the pointer to it is stale.
                      IoFaultCase{"LatestPointerDiskFull", "create@2", "checkpoints/latest.tmp", 4}),
    [](const ::testing::TestParamInfo<IoFaultCase>& info) { return info.param.name; });

// Two ranks; rank 1's part of the second save hits a full disk. Rank 0, whose writer waits for
// rank 1's files, learns it at once from rank 1's failure mark, not after the checkpoint
// timeout: both exit non-zero within seconds, and the previous checkpoint resumes.
TEST_F(Checkpoints, ASaveFailingOnOneRankEndsEveryRankPromptly) {
  const std::string common = "--set trainer.max_steps=8 --set checkpoint.every_steps=2 --set checkpoint.export_at_end=false"
                             " --set checkpoint.async=true --run-dir " + dir_.file("run");
  std::string out;
  const auto start = std::chrono::steady_clock::now();
  const int rc = run_command("TESSERA_IO_FAULT=write TESSERA_IO_FAULT_RANK=1 TESSERA_IO_FAULT_PATH=step_00000004.tmp/"
                             "rank_00001/rng.safetensors " +
                                 tessera("launch --nproc-per-node 2 -- train " + tiny() + data_set() + kShortWarmup +
                                         " --set settings.collective_timeout_s=300 " + common),
                             out);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(rc, 0) << out;
  // Well under the 300 s collective timeout, with room for a loaded machine.
  EXPECT_LT(seconds, 150) << "a rank waited for a timeout: " << out;
  EXPECT_NE(out.find("No space left on device"), std::string::npos) << out;
  EXPECT_NO_THROW(core::verify_checkpoint(dir_.file("run") + "/checkpoints/step_00000002"));
  EXPECT_FALSE(fs::exists(dir_.file("run") + "/checkpoints/step_00000004"));
  ASSERT_EQ(launch(2, common + " --resume auto", out), 0) << out;
  EXPECT_NE(out.find("at step 2 "), std::string::npos) << out;
}

// A save that fails on rank 0 alone (its model export, which only rank 0 writes), written in
// place: every rank learns it in the save itself and ends with an error naming where to look,
// instead of the others running on into the next step's collectives with a rank that is gone.
TEST_F(Checkpoints, AnExportFailingOnRankZeroAloneEndsEveryRankWithTheReason) {
  std::string out;
  const int rc = run_command("TESSERA_IO_FAULT=write TESSERA_IO_FAULT_RANK=0 TESSERA_IO_FAULT_PATH=step_00000002.tmp/"
                             "model.safetensors " +
                                 tessera("launch --nproc-per-node 2 -- train " + tiny() + data_set() + kShortWarmup +
                                         " --set settings.collective_timeout_s=120 --set trainer.max_steps=6"
                                         " --set checkpoint.every_steps=0 --set checkpoint.at_end=false"
                                         " --set checkpoint.export_every_steps=2 --set checkpoint.export_at_end=false"
                                         " --set checkpoint.async=false --run-dir " + dir_.file("run")),
                             out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("the save of step 2 failed"), std::string::npos) << out;
  EXPECT_NE(out.find("No space left on device"), std::string::npos) << out;
  EXPECT_NE(out.find("the last checkpoint save failed on another rank"), std::string::npos) << out;
}

TEST_F(Checkpoints, ACorruptFileIsFoundByItsChecksumAndSkipped) {
  const std::string common = "--set checkpoint.every_steps=2 --set checkpoint.export_at_end=false --run-dir " + dir_.file("run");
  std::string out;
  ASSERT_EQ(train(common + " --set trainer.max_steps=4", out), 0) << out;
  const std::string newest = dir_.file("run") + "/checkpoints/step_00000004";
  const std::string shard = newest + "/rank_00000/optimizer.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    f.write(&c, 1);
  }
  EXPECT_EQ(train(common + " --set trainer.max_steps=6 --resume " + newest, out), 1) << out;
  EXPECT_NE(out.find("rank_00000/optimizer.safetensors: checksum mismatch"), std::string::npos) << out;
  EXPECT_NE(out.find("the file is corrupt"), std::string::npos) << out;
  ASSERT_EQ(train(common + " --set trainer.max_steps=6 --resume auto", out), 0) << out;
  EXPECT_NE(out.find("skipping checkpoint: checkpoint " + newest), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from " + dir_.file("run") + "/checkpoints/step_00000002 at step 2"), std::string::npos) << out;
  // The resumed run saved step 4 again, replacing the corrupt one.
  EXPECT_EQ(core::verify_checkpoint(newest).step, 4);
  EXPECT_EQ(core::CheckpointStore(dir_.file("run") + "/checkpoints", "").newest_valid(), dir_.file("run") + "/checkpoints/step_00000006");
}

TEST_F(Checkpoints, KeepLastPrunesOlderOnesAndLatestNamesTheNewest) {
  std::string out;
  ASSERT_EQ(train("--set trainer.max_steps=8 --set checkpoint.every_steps=2 --set checkpoint.keep_last=2 "
                  "--set checkpoint.async=false --run-dir " + dir_.file("run"), out), 0)
      << out;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_.file("run") + "/checkpoints")) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000006", "step_00000008"}));
  std::ifstream latest(dir_.file("run") + "/checkpoints/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000008");
  const auto meta = core::verify_checkpoint(dir_.file("run") + "/checkpoints/step_00000008");
  EXPECT_EQ(meta.step, 8);
  EXPECT_EQ(meta.tokens, 8 * 512);
  EXPECT_EQ(meta.samples, 8 * 16);
  EXPECT_EQ(meta.world_size, 1);
  EXPECT_EQ(meta.tessera_version, "0.1.0");
  EXPECT_TRUE(meta.files.count("config.yaml"));
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(Checkpoints, ResumingFromAnOlderCheckpointSetsTheLaterOnesAside) {
  const std::string common = "--set checkpoint.every_steps=2 --set checkpoint.keep_last=2 --set trainer.max_steps=6 "
                             "--run-dir " + dir_.file("run");
  const std::string checkpoints = dir_.file("run") + "/checkpoints";
  const std::string exports = dir_.file("run") + "/exports";
  std::string out;
  ASSERT_EQ(train(common, out), 0) << out;
  ASSERT_TRUE(fs::exists(checkpoints + "/step_00000006"));
  ASSERT_TRUE(fs::exists(exports + "/step_00000006/model.safetensors"));
  // Resumed from step 4 with another learning rate: steps 5-6 take another history.
  ASSERT_EQ(train(common + " --set components.optimizer.config.lr=0.05 --resume " + checkpoints + "/step_00000004",
                  out), 0) << out;
  // The first history's step 6 is kept aside, the new one is the checkpoint, pruning (keep_last 2)
  // did not touch the new ones.
  EXPECT_TRUE(fs::exists(checkpoints + "/step_00000006.superseded")) << out;
  EXPECT_EQ(core::CheckpointStore(checkpoints, "").newest_valid(), checkpoints + "/step_00000006");
  EXPECT_EQ(core::verify_checkpoint(checkpoints + "/step_00000004").step, 4);
  // So is its export: the export of step 6 is this run's model, not the first one's.
  ASSERT_TRUE(fs::exists(exports + "/step_00000006.superseded/model.safetensors")) << out;
  expect_identical(read_safetensors(exports + "/step_00000006/model.safetensors").tensors, model_at(dir_.file("run"), 6));
  EXPECT_NE(bytes_of(exports + "/step_00000006/model.safetensors"),
            bytes_of(exports + "/step_00000006.superseded/model.safetensors"));
}

// A fresh run (no --resume) in a run folder that holds another run's checkpoints: they are set
// aside, so this run's saves of the same steps are written (not kept from the other run) and
// --resume auto afterwards resumes this run, not the other one's later step.
TEST_F(Checkpoints, AFreshRunInAUsedRunFolderSetsTheOtherRunsCheckpointsAside) {
  const std::string run = dir_.file("run"), checkpoints = run + "/checkpoints";
  const std::string common = "--set checkpoint.every_steps=2 --set checkpoint.export_at_end=false --run-dir " + run;
  std::string out;
  ASSERT_EQ(train(common + " --set trainer.max_steps=6", out), 0) << out;
  ASSERT_TRUE(fs::exists(checkpoints + "/step_00000006"));
  ASSERT_EQ(train(common + " --set trainer.max_steps=4 --set components.optimizer.config.lr=0.05", out), 0) << out;
  EXPECT_NE(out.find("this fresh run replaces"), std::string::npos) << out;
  for (const char* step : {"2", "4", "6"}) {
    EXPECT_TRUE(fs::exists(checkpoints + "/step_0000000" + step + ".superseded")) << step << "\n" << out;
  }
  EXPECT_FALSE(fs::exists(checkpoints + "/step_00000006"));
  // The checkpoint of step 4 is this run's: its resolved spec has this run's learning rate.
  const std::string saved_spec = bytes_of(checkpoints + "/step_00000004/config.yaml");
  EXPECT_NE(saved_spec.find("lr: 0.05"), std::string::npos) << saved_spec;
  EXPECT_NE(bytes_of(run + "/config.yaml").find(saved_spec), std::string::npos);
  EXPECT_EQ(core::CheckpointStore(checkpoints, "").newest_valid(), checkpoints + "/step_00000004");
}

TEST_F(Checkpoints, AFailedBackgroundSaveStopsTheRun) {
  std::string out;
  // A checkpoint directory below a regular file cannot be created.
  std::ofstream(dir_.file("file")) << "x";
  EXPECT_EQ(train("--set checkpoint.every_steps=50 --set trainer.max_steps=1000 --set checkpoint.dir=" +
                      dir_.file("file") + "/checkpoints --run-dir " + dir_.file("run"),
                  out),
            1)
      << out;
  EXPECT_NE(out.find("the save of step 50 failed"), std::string::npos) << out;
  // Stopped at a step boundary soon after the failure, not only when the next save (step 100)
  // would have waited for the failed one. The background writer fails within a few of the tiny
  // model's steps; 49 steps leave room for a loaded machine that runs it late.
  EXPECT_LT(read_metrics(dir_.file("run") + "/metrics.jsonl").size(), 100u) << out;
}

TEST_F(Checkpoints, ResumeAutoWithNothingToResumeStartsFresh) {
  std::string out;
  ASSERT_EQ(train("--set trainer.max_steps=2 --resume auto --run-dir " + dir_.file("run"), out), 0) << out;
  EXPECT_NE(out.find("no valid checkpoint"), std::string::npos) << out;
}

TEST_F(Checkpoints, SigtermSavesBeforeExiting) {
  const std::string run = dir_.file("run");
  const std::string metrics = run + "/metrics.jsonl";
  const std::string script = tessera("train " + tiny() + data_set() + " --set trainer.max_steps=100000 --run-dir " + run) +
                             " > " + dir_.file("log") + " 2>&1 & p=$!; for i in $(seq 600); do [ -f " + metrics +
                             " ] && [ $(wc -l < " + metrics + ") -ge 3 ] && break; sleep 0.1; done; kill -TERM $p; wait $p; echo rc=$?";
  std::string out;
  ASSERT_EQ(run_command("sh -c '" + script + "'", out), 0) << out;
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
  const std::string found = core::CheckpointStore(run + "/checkpoints", "").newest_valid();
  ASSERT_FALSE(found.empty()) << "a preempted run leaves a checkpoint";
  EXPECT_EQ(core::verify_checkpoint(found).step, static_cast<std::int64_t>(read_metrics(metrics).size()));
}

// Checkpoints written before the SDK's transformer kit (commit 776c2c0; the models' parameters
// kept their names and order) load into gpt, gpt_moe and a Mixtral-style llama, which train on
// exactly as that commit did: the same loss to the last bit at steps 4-6
// (tests/integration/fixtures/pre_kit/MODEL/expected.jsonl, logged by that commit's run). The
// reported gradient norm agrees within 1e-6: it differed in its last bit at some steps.
TEST_F(Checkpoints, CheckpointsWrittenBeforeTheKitTrainOnExactly) {
  const std::string fixture = testing::source_dir() + "/tests/integration/fixtures/pre_kit";
  const std::pair<std::string, std::string> models[] = {
      {"gpt", ""},
      {"gpt_moe",
       "--set components.model.variant_key=gpt_moe --set components.model.config.num_experts=4 "
       "--set components.model.config.moe_every=2"},
      {"llama",
       "--set components.model.variant_key=llama --set 'components.model.config={vocab_size: 256, n_layer: 2, "
       "n_head: 2, n_kv_head: 1, n_embd: 16, intermediate_size: 32, max_seq_len: 16, num_experts: 4}'"},
  };
  for (const auto& [model, sets] : models) {
    SCOPED_TRACE(model);
    std::string out;
    ASSERT_EQ(run_command(tessera("train " + fixture + "/run.yaml --set components.train_data.config.path=" + fixture +
                                  "/corpus.txt " + sets + " --resume " + fixture + "/" + model +
                                  "/step_00000003 --run-dir " + dir_.file(model)),
                          out),
              0)
        << out;
    const auto expected = read_metrics(fixture + "/" + model + "/expected.jsonl");
    const auto got = read_metrics(dir_.file(model) + "/metrics.jsonl");
    ASSERT_EQ(got.size(), expected.size()) << out;
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i]["step"], expected[i]["step"]);
      EXPECT_EQ(double(got[i]["loss"]), double(expected[i]["loss"])) << "step " << expected[i]["step"];
      EXPECT_NEAR(double(got[i]["grad_norm"]), double(expected[i]["grad_norm"]), 1e-6 * double(expected[i]["grad_norm"]))
          << "step " << expected[i]["step"];
    }
  }
}

}  // namespace checkpoint_test
}  // namespace tessera
