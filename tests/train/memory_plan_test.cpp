// memory_plan_test.cpp — the memory estimate (state exact from the shapes and the sharding, activations following
// the rows per micro-batch and activation checkpointing), the refusal and its advice, `meshtrain plan --memory`, and
// a real 2-host `train` refused on every host before it allocates the model.
#include "meshtrain/common/error.hpp"
#include "meshtrain/parallel/fsdp.hpp"
#include "meshtrain/train/memory_plan.hpp"
#include "runtime/process_runner.hpp"
#include "scratch_dir.hpp"
#include "train/train_test_support.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>


namespace meshtrain::train {
namespace {

using testing::settings_for;

MemoryPlan plan_for(const std::vector<std::string>& overrides, MemoryLayout layout) {
  return plan_memory(settings_for(overrides), layout);
}

const std::vector<std::string> k100m = {"model=llama-100m", "global_batch_size=8", "block_size=128"};

TEST(MemoryPlanTest, StateIsExactFromTheShapesAndShrinksWithFsdp) {
  const MemoryPlan one = plan_for(k100m, {1, 1, 1, 8});
  const int64_t embedding = 32000 * 768, head = 768;  // tied: the head unit is the final norm
  EXPECT_EQ(one.device.parameters, 4 * int64_t{100092672});
  EXPECT_EQ(one.device.gradients, one.device.parameters);
  EXPECT_EQ(one.device.optimizer, 2 * one.device.parameters);  // the moments (the update goes by chunks)
  const int64_t layer = (100092672 - embedding - head) / 12;
  const MemoryPlan four = plan_for(k100m, {4, 1, 4, 2, 1, 4});
  EXPECT_EQ(four.device.parameters, 4 * ((embedding + 3) / 4 + 12 * ((layer + 3) / 4) + (head + 3) / 4));
  // At 2 x 128 tokens per device the logits' gradient is smaller than the head weight's fp32 gradient, which is made
  // from it a reduce-scatter piece at a time, and the weight comes a piece at a time: a layer's backward is larger.
  // Its reduce-scatter in flight is one sum of the layer per host (the 4 devices of the group share it).
  const int64_t pieces = 2 * 4 * parallel::FsdpUnit::kReducePieceElements, layer_phase = 12 * layer + layer;
  EXPECT_EQ(four.device.gathered, std::max(layer_phase, pieces + 256 * 32000 * 4 + pieces));
  // Over Gloo (one member per host) fp32 send and receive buffers of the whole layer; over 2 hosts with 4 members of
  // the group on each, those of a quarter of it.
  EXPECT_EQ(plan_for(k100m, {4, 1, 1, 2, 1, 1}).device.gathered, 12 * layer + 8 * layer);
  EXPECT_EQ(plan_for(k100m, {8, 1, 4, 1, 1, 4}).device.gathered, 12 * layer + 2 * layer);
  // At 8 x 128 tokens per device the logits' gradient would be larger: the weight gathered whole with its gradient.
  EXPECT_EQ(plan_for(k100m, {4, 1, 4, 8}).device.gathered, 8 * embedding + pieces);
  EXPECT_LT(four.device.logits, one.device.logits);  // the head's gradient kept for backward: a quarter of it
  // Per host, the state follows the sharding: 8 devices over 2 hosts hold half of what 4 devices on one host do.
  const MemoryPlan eight = plan_for(k100m, {8, 1, 4, 1});
  EXPECT_LT(4 * (eight.device.parameters + eight.device.gradients + eight.device.optimizer),
            4 * (four.device.parameters + four.device.gradients + four.device.optimizer) * 6 / 10);
}

TEST(MemoryPlanTest, MixtralExpertsSplitOverTheExpertAxis) {
  // mixtral-tiny: per layer, attention 4 x 64 x 64 - 2 x 64 x 32 (GQA) ... counted from the config; each device
  // holds the router and E / expert of the 4 experts (3 x 64 x 128 each).
  const std::vector<std::string> tiny = {"model=mixtral-tiny", "global_batch_size=8", "block_size=64"};
  const int64_t expert = 3 * 64 * 128, all = settings_for(tiny).model.parameter_count();
  MemoryLayout one{1, 1, 1, 8};
  MemoryLayout split = one;
  split.expert = 2;
  EXPECT_EQ(plan_for(tiny, one).device.parameters, 4 * all);
  EXPECT_EQ(plan_for(tiny, split).device.parameters, 4 * (all - 2 * 2 * expert));  // 2 layers x 2 experts less
  EXPECT_NE(plan_for(tiny, split).describe().find("each layer's experts split over expert=2"), std::string::npos);
  // Each token's k = 2 experts keep their intermediates: more activations than one MLP of the same width.
  const MemoryPlan dense = plan_for({"model=llama-tiny", "model.intermediate_size=128", "global_batch_size=8",
                                     "block_size=64"}, one);
  EXPECT_GT(plan_for(tiny, one).device.activations, dense.device.activations);
}

TEST(MemoryPlanTest, ContextParallelismSplitsEachRowsActivations) {
  // llama-100m at 4096 tokens a row: with context=4 a device keeps a quarter of each row's activations, plus the
  // whole rows' keys and values each layer gathered (12 layers x 4096 tokens x K and V of 4 heads x 64, fp32).
  const std::vector<std::string> long_rows = {"model=llama-100m", "global_batch_size=8", "block_size=4096",
                                              "model.max_position_embeddings=4096"};
  const MemoryLayout whole{1, 1, 1, 1};
  MemoryLayout split = whole;
  split.context = 4;
  const MemoryPlan one = plan_for(long_rows, whole), four = plan_for(long_rows, split);
  EXPECT_EQ(four.device.parameters + four.device.optimizer, one.device.parameters + one.device.optimizer);
  const int64_t gathered_keys_values = 12 * int64_t{4096} * 2 * (4 * 64) * 4;
  EXPECT_GT(four.device.activations, one.device.activations / 4 + gathered_keys_values);
  EXPECT_LT(four.device.activations, one.device.activations / 4 + 2 * gathered_keys_values);
  EXPECT_NE(four.describe().find("each row's tokens split over context=4"), std::string::npos);
  // The refusal offers it: a row of 16384 tokens per device does not fit 2.5 GB even with activation checkpointing
  // and the state spread over 64x the hosts (more fsdp cannot split one row); split over context it does.
  const std::vector<std::string> longer_rows = {"model=llama-100m", "global_batch_size=8", "block_size=16384",
                                                "model.max_position_embeddings=16384"};
  try {
    check_memory_fits(settings_for(longer_rows), plan_for(longer_rows, whole), {int64_t{5} << 29, "test"});
    FAIL() << "expected a refusal";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("(dcn_mesh.context="), std::string::npos) << e.what();
  }
}

TEST(MemoryPlanTest, APipelineStageHoldsItsLayersAndTheActivationsItsScheduleKeeps) {
  // llama-10m (6 layers, untied) on 2 stages of 3 and 3 layers (given), 4 rows per device in 4 micro-batches.
  const std::vector<std::string> model = {"model=llama-10m", "global_batch_size=4", "block_size=256",
                                          "pipeline.microbatches=4", "pipeline.layers_per_stage=3,3"};
  MemoryLayout whole{1, 1, 1, 4};
  MemoryLayout staged = whole;
  staged.stage_layers = {3, 3};
  staged.pipeline_microbatches = 4;
  const MemoryPlan one = plan_for(model, whole);
  const MemoryPlan gpipe = plan_for([&] { auto o = model; o.push_back("pipeline.schedule=gpipe"); return o; }(), staged);
  const MemoryPlan one_f_one_b = plan_for(model, staged);
  // The state: the last stage holds 3 layers, the final norm and lm_head; the first 3 layers and the embedding (the
  // same size as lm_head): each about half the model.
  EXPECT_LT(one_f_one_b.device.parameters, one.device.parameters * 6 / 10);
  EXPECT_GT(one_f_one_b.device.parameters, one.device.parameters * 4 / 10);
  // GPipe keeps the activations of all 4 micro-batches of a quarter of the rows: about the whole pass's, for half the
  // layers; 1F1B on the first stage 2 of them, on the last 1 (the last is the larger: it has the loss).
  EXPECT_EQ(gpipe.in_flight, 4);
  EXPECT_EQ(one_f_one_b.stage, 1);
  EXPECT_EQ(one_f_one_b.in_flight, 1);
  EXPECT_LT(one_f_one_b.device.activations, gpipe.device.activations * 3 / 10);
  EXPECT_LT(gpipe.device.activations, one.device.activations * 6 / 10);
  EXPECT_NE(one_f_one_b.describe().find("pipeline stage 1 of 2 (the largest): 3 layers, 1 of 4 micro-batches in "
                                        "flight"), std::string::npos) << one_f_one_b.describe();
}

TEST(MemoryPlanTest, ActivationsFollowTheMicroBatchAndActivationCheckpointing) {
  const MemoryPlan whole = plan_for(k100m, {1, 1, 1, 8});
  const MemoryPlan halves = plan_for({"model=llama-100m", "block_size=128", "gradient_accumulation_steps=2"},
                                     {1, 1, 1, 8});
  EXPECT_EQ(halves.device.activations * 2, whole.device.activations);
  EXPECT_LT(halves.device.logits, whole.device.logits);
  // The loss: the head weight's fp32 gradient, the hidden states' gradient, one chunk of 262 rows of logits.
  EXPECT_EQ(whole.device.logits, 4 * 32000 * 768 + 8 * 128 * 768 * 4 + 262 * 32000 * 12);
  const MemoryPlan full = plan_for({"model=llama-100m", "block_size=128", "activation_checkpointing=full"},
                                   {1, 1, 1, 8});
  const MemoryPlan every_2 = plan_for({"model=llama-100m", "block_size=128", "activation_checkpointing=every_2"},
                                      {1, 1, 1, 8});
  EXPECT_LT(full.device.activations * 4, whole.device.activations);
  EXPECT_LT(full.device.activations, every_2.device.activations);
  EXPECT_LT(every_2.device.activations, whole.device.activations);
  EXPECT_EQ(full.device.parameters, whole.device.parameters);
}

TEST(MemoryPlanTest, RefusalGivesTheEstimateTheAvailableMemoryAndWhatWouldFit) {
  const settings::Settings settings = settings_for(k100m);
  const MemoryPlan plan = plan_memory(settings, {1, 1, 1, 8});
  EXPECT_NO_THROW(check_memory_fits(settings, plan, {plan.host_total(), "test"}));
  const int64_t available = plan.host_total() - (plan.device.activations / 2);
  try {
    check_memory_fits(settings, plan, {available, "MemAvailable"});
    FAIL() << "a plan larger than the available memory was accepted";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("needs about " + gigabytes(plan.host_total()) + " of memory per host"), std::string::npos)
        << message;
    EXPECT_NE(message.find(gigabytes(available) + " available (MemAvailable)"), std::string::npos) << message;
    EXPECT_NE(message.find("Refused before allocating anything"), std::string::npos) << message;
    // Activation checkpointing saves more than half the activations here: it is offered, with its estimate.
    settings::Settings full = settings;
    full.parallel.checkpoint_every = 1;
    EXPECT_NE(message.find("activation_checkpointing=full (" + gigabytes(plan_memory(full, plan.layout).host_total())),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("gradient_accumulation_steps=2"), std::string::npos) << message;
  }
}

TEST(MemoryPlanTest, PlanCommandPrintsTheEstimateForAnyLayoutWithoutStarting) {
  const std::vector<std::string> overrides = {"model=llama-3-8b", "global_batch_size=8", "block_size=4096",
                                              "ici_mesh.fsdp=4", "dcn_mesh.data=2"};
  std::vector<std::string> args = {"plan", "--memory", "--json", "--hosts", "2", "--devices-per-host", "4"};
  args.insert(args.end(), overrides.begin(), overrides.end());
  const testing::ProcessResult r = testing::run_meshtrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json memory = testing::json_line(r.output).at("memory");
  const MemoryPlan expected = plan_memory(settings_for(overrides), {4, 1, 4, 1, 1, 4});
  EXPECT_EQ(memory.at("model_parameters"), 8030261248);
  EXPECT_EQ(memory.at("per_device").at("parameters"), expected.device.parameters);
  EXPECT_EQ(memory.at("per_device").at("total"), expected.device.total());
  EXPECT_EQ(memory.at("per_host"), expected.host_total());
  EXPECT_NE(memory.at("verdict").get<std::string>().find("Refused before allocating anything"), std::string::npos);

  const testing::ProcessResult tiny = testing::run_meshtrain({"plan", "--memory", "--hosts", "2",
                                                               "--devices-per-host", "4", "ici_mesh.fsdp=4",
                                                               "dcn_mesh.fsdp=2"});
  ASSERT_EQ(tiny.exit_code, 0) << tiny.output;
  EXPECT_NE(tiny.output.find("Memory plan: parameters "), std::string::npos) << tiny.output;
  EXPECT_NE(tiny.output.find("available (MemAvailable): fits"), std::string::npos) << tiny.output;
}

TEST(MemoryPlanTest, TrainRefusesOnEveryHostBeforeAllocatingTheModel) {
  testing::ScratchDir out("memory_refusal");
  const testing::ProcessResult r = testing::run_meshtrain(
      {"run", "--hosts", "2", "--devices-per-host", "2", "--", "train", "model=llama-3-8b", "block_size=4096",
       "ici_mesh.fsdp=2", "dcn_mesh.fsdp=2", "output_dir=" + out.path().string()},
      120);
  EXPECT_NE(r.output.find("Memory plan: parameters "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Refused before allocating anything"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("activation_checkpointing=full"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Training a Llama"), std::string::npos) << r.output;  // never started
  EXPECT_NE(r.output.find("[meshtrain run] host 0 exited with code 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[meshtrain run] host 1 exited with code 2"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 60) << r.output;
}

}  // namespace
}  // namespace meshtrain::train
