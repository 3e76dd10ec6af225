// metrics_test.cpp — which steps are logged, the log line and metrics.jsonl (interval averages, MFU only with a
// known peak), lines dropped on resume so each step appears once, a diverged loss named, and the MFU peak.
#include "meshtrain/common/error.hpp"
#include "meshtrain/train/metrics.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "scratch_dir.hpp"

#include <chrono>
#include <cmath>
#include <fstream>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

class MetricsTest : public ::testing::Test {
 protected:
  settings::Settings run_config(int64_t max_steps, int64_t logging_steps) const {
    return settings::Settings::from_config(config::Config::load(
        config::default_config_dir(), {"output_dir=" + scratch_.path().string(),
                                       "max_steps=" + std::to_string(max_steps),
                                       "logging_steps=" + std::to_string(logging_steps)}));
  }
  static StepMetrics step_metrics(int64_t step) {
    StepMetrics m;
    m.step = step;
    m.epoch = 0;
    m.loss = 10.0 - 0.1 * static_cast<double>(step);
    m.grad_norm = 1.5;
    m.learning_rate = 1e-3;
    m.step_seconds = 0.5;
    m.data_wait_seconds = 0.05;
    m.compute_seconds = 0.4;
    m.comm_seconds = 0.05;
    m.tokens = 1000;
    m.num_devices = 4;
    m.flops_per_token = 1e6;
    return m;
  }
  // Logs steps [from, to] and returns what went to stderr.
  static std::string run(MetricsLogger& logger, int64_t from, int64_t to, bool finish = true) {
    ::testing::internal::CaptureStderr();
    for (int64_t s = from; s <= to; ++s) logger.log(step_metrics(s));
    if (finish) logger.finish();
    return ::testing::internal::GetCapturedStderr();
  }
  std::vector<nlohmann::json> lines() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(scratch_.path() / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  std::vector<int64_t> logged_steps() const {
    std::vector<int64_t> steps;
    for (const auto& j : lines()) steps.push_back(j["step"].get<int64_t>());
    return steps;
  }

  meshtrain::testing::ScratchDir scratch_{"meshtrain_metrics_test"};
};

TEST_F(MetricsTest, LogsStepOneEveryLoggingStepsAndTheLast) {
  MetricsLogger logger(run_config(11, 5), true, PeakFlops{});
  const std::string err = run(logger, 1, 11);
  EXPECT_EQ(logged_steps(), (std::vector<int64_t>{1, 5, 10, 11}));
  EXPECT_NE(err.find("step: 5/11, loss (global mean): 9.5000"), std::string::npos) << err;
  EXPECT_EQ(err.find("MFU"), std::string::npos) << err;  // the peak is unknown
  EXPECT_EQ(err.find('\r'), std::string::npos) << err;   // no progress bar off a terminal
}

TEST_F(MetricsTest, JsonLinesHoldIntervalAveragesAndMfu) {
  MetricsLogger logger(run_config(4, 2), true, PeakFlops{1e9, "configured"});
  run(logger, 1, 4);
  const auto all = lines();
  ASSERT_EQ(all.size(), 3u);
  const nlohmann::json& j = all[1];  // step 2
  for (const char* key : {"step", "epoch", "loss", "grad_norm", "lr", "tokens_per_s", "tokens_per_s_per_device", "mfu",
                          "step_time_s", "data_wait_s", "compute_s", "comm_s"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["step"], 2);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 9.8);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 2000.0);  // 1000 tokens in 0.5 s
  EXPECT_DOUBLE_EQ(j["tokens_per_s_per_device"].get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.5);  // 1e6 flops/token * 500 tokens/s / 1e9
  EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["data_wait_s"].get<double>(), 0.05);
}

TEST_F(MetricsTest, LogLineShowsMfuAndDataWaitWhenThePeakIsKnown) {
  MetricsLogger logger(run_config(2, 1), true, PeakFlops{1e9, "configured"});
  const std::string err = run(logger, 1, 1, false);
  EXPECT_NE(err.find("tokens/s: 2000 (500/device), MFU: 50.0%"), std::string::npos) << err;
  EXPECT_NE(err.find("data wait: 50.0 ms (10.0%)"), std::string::npos) << err;
}

TEST_F(MetricsTest, ResumedRunKeepsOneLinePerStep) {
  {
    MetricsLogger first(run_config(10, 2), true, PeakFlops{});
    run(first, 1, 9, false);  // "crashes" after step 9: lines 1 2 4 6 8
  }
  MetricsLogger resumed(run_config(10, 2), true, PeakFlops{}, /*first_step=*/7);  // from the checkpoint at step 6
  EXPECT_EQ(logged_steps(), (std::vector<int64_t>{1, 2, 4, 6}));
  run(resumed, 7, 10);
  EXPECT_EQ(logged_steps(), (std::vector<int64_t>{1, 2, 4, 6, 8, 10}));
}

TEST_F(MetricsTest, FreshRunStartsANewFile) {
  {
    MetricsLogger old_run(run_config(4, 1), true, PeakFlops{});
    run(old_run, 1, 4);
  }
  MetricsLogger logger(run_config(4, 1), true, PeakFlops{});
  run(logger, 1, 2);
  EXPECT_EQ(logged_steps(), (std::vector<int64_t>{1, 2}));
}

TEST_F(MetricsTest, FinishLogsTheLastStepOfARunThatEndedEarly) {
  MetricsLogger logger(run_config(100, 10), true, PeakFlops{});
  run(logger, 1, 13);
  EXPECT_EQ(logged_steps(), (std::vector<int64_t>{1, 10, 13}));
}

TEST_F(MetricsTest, OnlyTheWriterWritesTheFile) {
  MetricsLogger logger(run_config(3, 1), false, PeakFlops{});
  const std::string err = run(logger, 1, 3);
  EXPECT_FALSE(fs::exists(scratch_.path() / "metrics.jsonl"));
  EXPECT_NE(err.find("step: 3/3"), std::string::npos) << err;
}

TEST_F(MetricsTest, DivergedLossNamesTheStep) {
  MetricsLogger logger(run_config(10, 5), true, PeakFlops{});
  StepMetrics m = step_metrics(3);
  m.loss = std::nan("");
  try {
    logger.log(m);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("step 3: the loss is nan"), std::string::npos) << e.what();
  }
}

TEST_F(MetricsTest, BadLoggingStepsNamesTheKey) {
  try {
    MetricsLogger logger(run_config(10, 0), true, PeakFlops{});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("logging_steps"), std::string::npos) << e.what();
  }
}

TEST(PeakFlopsTest, ConfiguredPeakIsUsed) {
  const PeakFlops peak = decide_peak_flops(/*configured_gflops=*/250, torch::kBFloat16, 1);
  EXPECT_DOUBLE_EQ(peak.flops, 250e9);
  EXPECT_EQ(peak.source, "configured");
  EXPECT_EQ(peak.measured, 0);  // nothing measured
  EXPECT_EQ(PeakFlops::from_json(peak.to_json(), "test").describe(), peak.describe());
}

TEST(PeakFlopsTest, MeasuresAShortPeakWhenNoneIsConfigured) {
  const int threads_before = at::get_num_threads();
  const auto start = std::chrono::steady_clock::now();
  const PeakFlops decided = decide_peak_flops(/*configured_gflops=*/0, torch::kFloat32, 1);
  const double peak = decided.measured;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(peak, 1e8);
  EXPECT_LT(seconds, 3.0);  // < 1 s on a fast BLAS; the reference BLAS needs two 1024^3 products
  EXPECT_TRUE(decided.source == "theoretical" || decided.source == "measured") << decided.source;
  EXPECT_EQ(decided.flops, decided.source == "theoretical" ? decided.theoretical : decided.measured);
  EXPECT_NE(decided.describe().find("measured"), std::string::npos) << decided.describe();
  EXPECT_EQ(at::get_num_threads(), threads_before);
}

}  // namespace
}  // namespace meshtrain::train
