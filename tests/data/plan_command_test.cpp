// plan_command_test.cpp — `meshtrain plan --step N` run as the real binary: the `data` member of its JSON (global
// batch, rows per host and device, token ranges with context parallelism) and its text, checked against the sampler
// and the read plan.
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

// dcn_mesh.context=2 on 2 hosts x 2 devices (fsdp=2 inside each): host 0 reads chunks 0 and 3 of the 4 chunks of
// every row, host 1 chunks 1 and 2 (one range); each device names its context rank and its chunks, in load-balanced
// order.
TEST(PlanCommandTest, JsonAndTextShowTheTokenRangesOfEveryHostAndDeviceWithContext) {
  const std::vector<std::string> job = {"--hosts", "2", "--devices-per-host", "2", "--step", "3",
                                        "dcn_mesh.context=2", "dataset.path=moby-dick-byte"};
  std::vector<std::string> json_args = {"plan", "--json"};
  json_args.insert(json_args.end(), job.begin(), job.end());
  const ProcessResult r = run_meshtrain(json_args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json data = json_line(r.output).at("data");
  const nlohmann::json expected_hosts = nlohmann::json::parse(R"([
    {"host": 0, "rows": [0, 1, 2, 3, 4, 5, 6, 7], "tokens": [[0, 64], [192, 256]],
     "devices": [{"device": 0, "rows": [0, 1, 2, 3], "context_rank": 0, "tokens": [[0, 64], [192, 256]]},
                 {"device": 1, "rows": [4, 5, 6, 7], "context_rank": 0, "tokens": [[0, 64], [192, 256]]}]},
    {"host": 1, "rows": [0, 1, 2, 3, 4, 5, 6, 7], "tokens": [[64, 192]],
     "devices": [{"device": 2, "rows": [0, 1, 2, 3], "context_rank": 1, "tokens": [[64, 128], [128, 192]]},
                 {"device": 3, "rows": [4, 5, 6, 7], "context_rank": 1, "tokens": [[64, 128], [128, 192]]}]}])");
  EXPECT_EQ(data.at("hosts"), expected_hosts);
  EXPECT_EQ(data.at("sequence"), nlohmann::json::parse(R"({"context": 2, "order": "load-balanced",
                                                          "type": "i32[8@(data,fsdp), 256@context]"})"));

  std::vector<std::string> text_args = {"plan"};
  text_args.insert(text_args.end(), job.begin(), job.end());
  const ProcessResult text = run_meshtrain(text_args);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const std::string& line : {"input_ids/labels i32[8@(data,fsdp), 256@context]",
                                  "sequence over context in load-balanced order",
                                  "host 0 reads rows 0:8 x tokens [0:64, 192:256] (samples ",
                                  "host 1 reads rows 0:8 x tokens [64:192] (samples ",
                                  "holds rows 4:8 x tokens [64:128, 128:192] (samples "})
    EXPECT_NE(text.output.find(line), std::string::npos) << line << "\n" << text.output;
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
