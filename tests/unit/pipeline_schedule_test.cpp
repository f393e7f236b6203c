// The pipeline schedules: every rank's order runs to the end when receives block and sends do
// not (simulated for gpipe, 1f1b and interleaved_1f1b over several pp, stages per rank and
// micro-batch counts), every stage runs each micro-batch's forward once and then its backward,
// 1f1b holds at most pp - rank micro-batches' activations where gpipe holds all, and the bubble.
#include "tessera/parallel/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "tessera/error.hpp"

namespace tessera::core {
namespace pipeline_schedule_test {

using Kind = PipelineAction::Kind;

// Runs every rank's schedule: a forward needs the stage before's forward of that micro-batch, a
// backward its own forward and the stage after's backward. Returns whether all finished.
bool runs_to_the_end(const std::string& schedule, std::int64_t pp, std::int64_t v, std::int64_t m) {
  std::vector<std::vector<PipelineAction>> order;
  for (std::int64_t r = 0; r < pp; ++r) order.push_back(pipeline_schedule(schedule, pp, v, r, m));
  const std::int64_t stages = pp * v;
  std::set<std::tuple<int, std::int64_t, std::int64_t>> done;
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::int64_t r = 0; r < pp; ++r) {
      auto& i = next[static_cast<std::size_t>(r)];
      while (i < order[static_cast<std::size_t>(r)].size()) {
        const PipelineAction& a = order[static_cast<std::size_t>(r)][i];
        const bool forward = a.kind == Kind::forward;
        const bool ready =
            forward ? (a.stage == 0 || done.count({0, a.stage - 1, a.micro_batch}))
                    : done.count({0, a.stage, a.micro_batch}) &&
                          (a.stage == stages - 1 || done.count({1, a.stage + 1, a.micro_batch}));
        if (!ready) break;
        done.insert({forward ? 0 : 1, a.stage, a.micro_batch});
        ++i;
        progress = true;
      }
    }
  }
  return static_cast<std::int64_t>(done.size()) == 2 * stages * m;
}

TEST(PipelineSchedule, EveryScheduleRunsToTheEnd) {
  for (const std::int64_t pp : {2, 3, 4}) {
    for (const std::int64_t m : {1, 2, 4, 8, 12}) {
      SCOPED_TRACE("pp " + std::to_string(pp) + ", " + std::to_string(m) + " micro-batches");
      EXPECT_TRUE(runs_to_the_end("gpipe", pp, 1, m));
      EXPECT_TRUE(runs_to_the_end("1f1b", pp, 1, m));
      for (const std::int64_t v : {2, 3}) {
        if (m % pp == 0) EXPECT_TRUE(runs_to_the_end("interleaved_1f1b", pp, v, m)) << v << " stages per rank";
      }
    }
  }
}

TEST(PipelineSchedule, EachStageRunsEveryMicroBatchForwardThenBackward) {
  for (const auto& [schedule, v] : std::vector<std::pair<std::string, std::int64_t>>{
           {"gpipe", 1}, {"1f1b", 1}, {"interleaved_1f1b", 2}}) {
    SCOPED_TRACE(schedule);
    const std::int64_t pp = 2, m = 4;
    for (std::int64_t r = 0; r < pp; ++r) {
      std::map<std::pair<std::int64_t, std::int64_t>, int> seen;  // (stage, mb) -> forwards then backwards
      for (const PipelineAction& a : pipeline_schedule(schedule, pp, v, r, m)) {
        EXPECT_EQ(a.stage % pp, r) << "stage " << a.stage << " is on rank " << a.stage % pp;
        int& state = seen[{a.stage, a.micro_batch}];
        EXPECT_EQ(state, a.kind == Kind::forward ? 0 : 1) << "stage " << a.stage << " micro-batch " << a.micro_batch;
        ++state;
      }
      EXPECT_EQ(static_cast<std::int64_t>(seen.size()), v * m);
      for (const auto& [key, state] : seen) EXPECT_EQ(state, 2);
    }
  }
}

// Activations held: forwards run whose backward has not.
std::int64_t most_held(const std::vector<PipelineAction>& order) {
  std::int64_t held = 0, most = 0;
  for (const PipelineAction& a : order) {
    held += a.kind == Kind::forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostPpMicroBatchesWhereGpipeHoldsAll) {
  const std::int64_t pp = 4, m = 8;
  for (std::int64_t r = 0; r < pp; ++r) {
    EXPECT_EQ(most_held(pipeline_schedule("gpipe", pp, 1, r, m)), m);
    EXPECT_EQ(most_held(pipeline_schedule("1f1b", pp, 1, r, m)), pp - r);
  }
}

TEST(PipelineSchedule, TheBubbleShrinksWithMicroBatchesAndInterleaving) {
  EXPECT_DOUBLE_EQ(pipeline_bubble("1f1b", 4, 1, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble("gpipe", 2, 1, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble("interleaved_1f1b", 4, 2, 8), 3.0 / 19.0);
  EXPECT_THROW(pipeline_schedule("interleaved_1f1b", 4, 2, 0, 6), Error);
  EXPECT_THROW(pipeline_schedule("zero_bubble", 2, 1, 0, 4), Error);
}

}  // namespace pipeline_schedule_test
}  // namespace tessera::core
