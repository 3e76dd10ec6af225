// pipeline_schedule_test.cpp — the stages' layers, the GPipe and 1F1B orders, the timeline and its bubble, and the
// refusals of layouts that do not fit (parallel/pipeline_schedule.hpp).
#include "meshtrain/common/error.hpp"
#include "meshtrain/parallel/pipeline_schedule.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace meshtrain::parallel {
namespace {

using settings::PipelineSchedule;
using Kind = StageAction::Kind;

std::vector<int64_t> counts(const std::vector<StageLayers>& stages) {
  std::vector<int64_t> out;
  for (const StageLayers& s : stages) out.push_back(s.size());
  return out;
}

template <typename Fn>
std::string user_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineScheduleTest, StagesBalanceTheHeadAgainstLayers) {
  // Equal layers, no head: as even as can be, the earlier stages taking the extra layers.
  EXPECT_EQ(counts(split_layers(8, 4, 1.0, 0.0)), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(counts(split_layers(7, 3, 1.0, 0.0)), (std::vector<int64_t>{3, 2, 2}));
  // A head worth two layers: the last stage gives up layers for it.
  EXPECT_EQ(counts(split_layers(8, 2, 1.0, 2.0)), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(counts(split_layers(6, 3, 1.0, 1.0)), (std::vector<int64_t>{3, 2, 1}));
  // Contiguous, covering every layer once.
  const std::vector<StageLayers> stages = split_layers(10, 4, 1.0, 1.5);
  EXPECT_EQ(stages.front().first, 0);
  EXPECT_EQ(stages.back().end, 10);
  for (size_t s = 1; s < stages.size(); ++s) EXPECT_EQ(stages[s].first, stages[s - 1].end);
  // Given counts win.
  EXPECT_EQ(counts(split_layers(6, 2, 1.0, 5.0, {1, 5})), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(describe_stages(split_layers(4, 2, 1.0, 0.0)),
            "stage 0: embedding, layers 0-1; stage 1: layers 2-3, final norm, head and loss");
}

TEST(PipelineScheduleTest, LayoutsThatDoNotFitAreRefusedWithAValueThatDoes) {
  const std::string too_many = user_error_of([] { split_layers(2, 4, 1.0, 0.0); });
  EXPECT_NE(too_many.find("pipeline=4"), std::string::npos) << too_many;
  EXPECT_NE(too_many.find("pipeline=2 at most"), std::string::npos) << too_many;
  const std::string wrong_counts = user_error_of([] { split_layers(6, 2, 1.0, 0.0, {2, 2}); });
  EXPECT_NE(wrong_counts.find("pipeline.layers_per_stage"), std::string::npos) << wrong_counts;
  EXPECT_NE(wrong_counts.find("\"3,3\""), std::string::npos) << wrong_counts;
  const std::string microbatches = user_error_of([] { pipeline_microbatches(3, 8); });
  EXPECT_NE(microbatches.find("pipeline.microbatches=3"), std::string::npos) << microbatches;
  EXPECT_NE(microbatches.find("1, 2, 4, 8"), std::string::npos) << microbatches;
  EXPECT_EQ(pipeline_microbatches(0, 8), 8);
  EXPECT_EQ(pipeline_microbatches(4, 8), 4);
}

TEST(PipelineScheduleTest, EveryMicroBatchRunsForwardThenBackwardOnEveryStage) {
  for (PipelineSchedule schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int stages : {1, 2, 4})
      for (int virtual_stages : {1, 2, 3})
        for (int64_t microbatches : {1, 3, 8}) {
          if (virtual_stages > 1 && microbatches % stages != 0) continue;  // refused (pipeline_microbatches)
          for (int stage = 0; stage < stages; ++stage) {
            const std::vector<StageAction> actions =
                stage_actions(schedule, stages, stage, microbatches, virtual_stages);
            ASSERT_EQ(actions.size(), static_cast<size_t>(2 * microbatches * virtual_stages));
            for (int64_t m = 0; m < microbatches; ++m)
              for (int v = 0; v < virtual_stages; ++v) {
                const auto forward = std::find(actions.begin(), actions.end(), StageAction{Kind::forward, m, v});
                const auto backward = std::find(actions.begin(), actions.end(), StageAction{Kind::backward, m, v});
                ASSERT_TRUE(forward != actions.end() && backward != actions.end());
                EXPECT_LT(forward - actions.begin(), backward - actions.begin());
              }
          }
          // The simulation ends (no stage waits for a pass that never comes) with every stage busy 3 M V slots.
          EXPECT_NE(schedule_timeline(schedule, stages, microbatches, virtual_stages)
                        .find(fmt::format("each stage busy {} ", 3 * microbatches * virtual_stages)),
                    std::string::npos);
        }
}

TEST(PipelineScheduleTest, VirtualStagesInterleaveAndShrinkTheBubble) {
  // 2 ranks x 2 virtual stages, 4 micro-batches: rank 0 holds stages 0 and 2; micro-batches go in groups of 2.
  const std::vector<StageAction> rank0 = stage_actions(PipelineSchedule::one_f_one_b, 2, 0, 4, 2);
  EXPECT_EQ(rank0[0], (StageAction{Kind::forward, 0, 0}));
  EXPECT_EQ(rank0[1], (StageAction{Kind::forward, 1, 0}));
  EXPECT_EQ(rank0[2], (StageAction{Kind::forward, 0, 1}));
  EXPECT_EQ(rank0[3], (StageAction{Kind::forward, 1, 1}));
  EXPECT_EQ(rank0[5], (StageAction{Kind::backward, 0, 1}));  // the last stage's backward comes first
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(2, 4, 2), 1.0 / 9.0);
  const std::string timeline = schedule_timeline(PipelineSchedule::one_f_one_b, 2, 4, 2);
  EXPECT_NE(timeline.find("stage 0 | F0.0 F1.0 F0.1 F1.1"), std::string::npos) << timeline;
  EXPECT_NE(timeline.find("bubble 11.1% of the pass (ideal (S-1)/(VM+S-1) = 11.1%)"), std::string::npos) << timeline;
  EXPECT_EQ(counts(split_layers(8, 2, 1.0, 0.0, {}, 2)), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(describe_stages(split_layers(4, 2, 1.0, 0.0, {}, 2), 2),
            "stage 0 (rank 0): embedding, layer 0; stage 1 (rank 1): layer 1; stage 2 (rank 0): layer 2; "
            "stage 3 (rank 1): layer 3, final norm, head and loss");
  const std::string microbatches = user_error_of([] { pipeline_microbatches(3, 6, 2, 2); });
  EXPECT_NE(microbatches.find("be a multiple of pipeline=2"), std::string::npos) << microbatches;
  EXPECT_NE(microbatches.find("use one of 2, 6"), std::string::npos) << microbatches;
  const std::string too_many = user_error_of([] { split_layers(4, 2, 1.0, 0.0, {}, 3); });
  EXPECT_NE(too_many.find("pipeline=2 x pipeline.virtual_stages=3 splits the model into 6 stages"),
            std::string::npos) << too_many;
}

TEST(PipelineScheduleTest, OneFOneBKeepsAtMostTheStagesAheadInFlight) {
  const std::vector<StageAction> stage0 = stage_actions(PipelineSchedule::one_f_one_b, 4, 0, 8);
  // Three forwards fill the pipeline, then forward and backward alternate.
  EXPECT_EQ(stage0[0], (StageAction{Kind::forward, 0}));
  EXPECT_EQ(stage0[2], (StageAction{Kind::forward, 2}));
  EXPECT_EQ(stage0[3], (StageAction{Kind::forward, 3}));
  EXPECT_EQ(stage0[4], (StageAction{Kind::backward, 0}));
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(microbatches_in_flight(PipelineSchedule::one_f_one_b, 4, stage, 8), 4 - stage);
    EXPECT_EQ(microbatches_in_flight(PipelineSchedule::gpipe, 4, stage, 8), 8);
  }
}

TEST(PipelineScheduleTest, TimelineShowsTheIdealBubble) {
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(4, 8), 3.0 / 11.0);
  for (PipelineSchedule schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    const std::string timeline = schedule_timeline(schedule, 2, 4);
    // 2 stages x 4 micro-batches: (4 + 1) x 3 slots, 12 busy on each stage.
    EXPECT_NE(timeline.find("15 slots"), std::string::npos) << timeline;
    EXPECT_NE(timeline.find("bubble 20.0% of the pass"), std::string::npos) << timeline;
  }
  EXPECT_EQ(schedule_timeline(PipelineSchedule::one_f_one_b, 2, 2),
            "stage 0 | F0 F1 .. .. B0 B0 .. B1 B1\n"
            "stage 1 | .. F0 B0 B0 F1 B1 B1 .. ..\n"
            "1f1b with 2 stages x 2 micro-batches: 9 slots, each stage busy 6 (a forward 1 slot, a backward 2): "
            "bubble 33.3% of the pass (ideal (S-1)/(M+S-1) = 33.3%)");
}

}  // namespace
}  // namespace meshtrain::parallel
