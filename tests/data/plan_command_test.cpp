// plan_command_test.cpp — `meshtrain plan --step N` run as the real binary: the `data` member of its JSON (global
// batch, rows per host and device) and its text, checked against the sampler and the read plan.
#include "meshtrain/data/dataset.hpp"
#include "meshtrain/data/global_sampler.hpp"
#include "runtime/process_runner.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>


namespace meshtrain::testing {
namespace {

TEST(PlanCommandTest, JsonDataMemberNamesTheSamplesAndRowsOfEveryHostAndDevice) {
  const ProcessResult r = run_meshtrain({"plan", "--json", "--hosts", "2", "--devices-per-host", "4", "--step", "3",
                                         "ici_mesh.fsdp=4", "ici_mesh.tensor=2", "dataset.path=moby-dick-byte"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json data = json_line(r.output).at("data");
  const data::TokenDataset dataset(data::TokenDataset::resolve("moby-dick-byte"), 256, token_shards::PayloadCheck::never);
  const data::GlobalSampler sampler(42, dataset.num_samples(), 8);
  EXPECT_EQ(data.at("epoch"), 0);
  EXPECT_EQ(data.at("step"), 3);
  EXPECT_EQ(data.at("global_batch").get<std::vector<int64_t>>(), sampler.global_batch(0, 3));
  // fsdp=4 x tensor=2: rows in 4 blocks of 2 over (data,fsdp); the two tensor devices of a block hold the same rows.
  const nlohmann::json expected_hosts = nlohmann::json::parse(R"([
    {"host": 0, "rows": [0, 1, 2, 3], "devices": [{"device": 0, "rows": [0, 1]}, {"device": 1, "rows": [0, 1]},
                                                  {"device": 2, "rows": [2, 3]}, {"device": 3, "rows": [2, 3]}]},
    {"host": 1, "rows": [4, 5, 6, 7], "devices": [{"device": 4, "rows": [4, 5]}, {"device": 5, "rows": [4, 5]},
                                                  {"device": 6, "rows": [6, 7]}, {"device": 7, "rows": [6, 7]}]}])");
  EXPECT_EQ(data.at("hosts"), expected_hosts);
}

TEST(PlanCommandTest, TextShowsTheStepAcrossEpochs) {
  const data::TokenDataset dataset(data::TokenDataset::resolve("moby-dick-byte"), 256, token_shards::PayloadCheck::never);
  const data::GlobalSampler sampler(42, dataset.num_samples(), 8);
  const int64_t step = sampler.batches_per_epoch() + 2;  // epoch 1, step 2
  const ProcessResult r = run_meshtrain({"plan", "--hosts", "2", "--devices-per-host", "4", "--step",
                                         std::to_string(step), "dataset.path=moby-dick-byte"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Data at step " + std::to_string(step) + " = epoch 1 step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Minibatch dataloading: True"), std::string::npos) << r.output;
  const std::vector<int64_t> ids = sampler.global_batch(1, 2);
  EXPECT_NE(r.output.find("host 1 reads rows 4:8 (samples " + std::to_string(ids[4])), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("holds rows 7:8 (samples " + std::to_string(ids[7]) + ")"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace meshtrain::testing
