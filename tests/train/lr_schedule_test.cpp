// lr_schedule_test.cpp — warmup, cosine / linear / constant decay at known steps, and the config checks.
#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"
#include "meshtrain/train/lr_schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace meshtrain::train {
namespace {

using Decay = LrSchedule::Decay;

TEST(LrScheduleTest, WarmsUpLinearlyFromZero) {
  LrSchedule s(Decay::cosine, 1.0, 5, 25, 0.1);
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(1), 0.2);
  EXPECT_DOUBLE_EQ(s.at(4), 0.8);
  EXPECT_DOUBLE_EQ(s.at(5), 1.0);
}

TEST(LrScheduleTest, CosineDecaysToMinAtMaxSteps) {
  LrSchedule s(Decay::cosine, 2.0, 5, 25, 0.1);
  EXPECT_NEAR(s.at(10), 0.2 + 1.8 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);  // 1.736...
  EXPECT_NEAR(s.at(15), 1.1, 1e-12);                                          // half way
  EXPECT_NEAR(s.at(25), 0.2, 1e-12);
  EXPECT_NEAR(s.at(40), 0.2, 1e-12);  // stays at the minimum past max_steps
}

TEST(LrScheduleTest, LinearDecaysToMinAtMaxSteps) {
  LrSchedule s(Decay::linear, 1.0, 5, 25, 0.1);
  EXPECT_NEAR(s.at(10), 0.775, 1e-12);
  EXPECT_NEAR(s.at(15), 0.55, 1e-12);
  EXPECT_NEAR(s.at(25), 0.1, 1e-12);
}

TEST(LrScheduleTest, ConstantAfterWarmup) {
  LrSchedule s(Decay::constant, 0.5, 2, 10, 0.1);
  EXPECT_DOUBLE_EQ(s.at(1), 0.25);
  EXPECT_DOUBLE_EQ(s.at(2), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 0.5);
  EXPECT_DOUBLE_EQ(s.at(100), 0.5);
}

TEST(LrScheduleTest, NoWarmupStartsAtTheFullRate) {
  LrSchedule s(Decay::cosine, 1.0, 0, 10, 0.0);
  EXPECT_NEAR(s.at(1), 0.5 * (1 + std::cos(M_PI * 0.1)), 1e-12);
  EXPECT_NEAR(s.at(10), 0.0, 1e-12);
}

TEST(LrScheduleTest, WarmupAsLongAsTheRun) {
  LrSchedule s(Decay::cosine, 1.0, 10, 10, 0.1);
  EXPECT_DOUBLE_EQ(s.at(5), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_DOUBLE_EQ(s.at(11), 0.1);
}

TEST(LrScheduleTest, FromConfigUsesTheDefaults) {
  // defaults.yaml: learning_rate 3e-3, cosine, warmup 5, min_lr_ratio 0.1, max_steps 20.
  const LrSchedule s(settings::Settings::from_config(config::Config::load(config::default_config_dir(), {})));
  EXPECT_DOUBLE_EQ(s.at(5), 3e-3);
  EXPECT_NEAR(s.at(20), 3e-4, 1e-15);
}

TEST(LrScheduleTest, BadValuesNameTheKey) {
  auto error_of = [](const std::string& override_text) -> std::string {
    try {
      settings::Settings::from_config(config::Config::load(config::default_config_dir(), {override_text}));
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("lr_scheduler.type=step").find("lr_scheduler.type"), std::string::npos);
  EXPECT_NE(error_of("lr_scheduler.warmup_steps=-1").find("lr_scheduler.warmup_steps"), std::string::npos);
  EXPECT_NE(error_of("lr_scheduler.min_lr_ratio=1.5").find("lr_scheduler.min_lr_ratio"), std::string::npos);
  EXPECT_NE(error_of("max_steps=0").find("max_steps"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain::train
