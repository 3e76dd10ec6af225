// train_settings_test.cpp — the trainer's settings, resolved once from the config: values, checks, fault injection.
#include "meshtrain/common/error.hpp"
#include "meshtrain/train/train_settings.hpp"
#include "train/train_test_support.hpp"

#include <gtest/gtest.h>

namespace meshtrain::train {
namespace {

using testing::run_config;
using testing::settings_for;

TEST(TrainSettingsTest, ReadsTheTrainerKeys) {
  const TrainSettings s = settings_for({"max_steps=7", "output_dir=/tmp/x", "compute_dtype=bfloat16", "seed=9"});
  EXPECT_EQ(s.max_steps, 7);
  EXPECT_EQ(s.checkpoints, std::filesystem::path("/tmp/x/checkpoints"));
  EXPECT_EQ(s.compute_dtype, torch::kBFloat16);
  EXPECT_EQ(s.seed, 9u);
  EXPECT_EQ(s.trajectory.at("seed"), "9");
  EXPECT_EQ(s.trajectory.count("output_dir"), 0u);
  EXPECT_EQ(s.fault.kind, FaultInjection::Kind::none);
}

TEST(TrainSettingsTest, Bf16MatmulIsAutoUnlessSetAndNotPartOfTheTrajectory) {
  EXPECT_EQ(bf16_matmul_of(run_config({})), model::Bf16Matmul::automatic);
  EXPECT_EQ(bf16_matmul_of(run_config({"bf16_matmul=native"})), model::Bf16Matmul::native);
  EXPECT_EQ(bf16_matmul_of(run_config({"bf16_matmul=fp32_gemm"})), model::Bf16Matmul::fp32_gemm);
  // A run may resume on another CPU, where auto takes the other path: the same numerics up to summation order.
  EXPECT_EQ(settings_for({"bf16_matmul=fp32_gemm"}).trajectory.count("bf16_matmul"), 0u);
}

TEST(TrainSettingsTest, BadValuesNameTheKey) {
  EXPECT_THROW(
      {
        try {
          settings_for({"max_steps=0"});
        } catch (const UserError& e) {
          EXPECT_NE(std::string(e.what()).find("max_steps"), std::string::npos) << e.what();
          throw;
        }
      },
      UserError);
  EXPECT_THROW(settings_for({"compute_dtype=float16"}), UserError);
  try {
    bf16_matmul_of(run_config({"bf16_matmul=bf16"}));
    FAIL() << "an unknown bf16_matmul was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16_matmul=bf16: expected auto"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("native"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp32_gemm"), std::string::npos) << e.what();
  }
  try {
    settings_for({"debug.fault=explode"});
    FAIL() << "an unknown fault was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("debug.fault=explode: expected none, throw, hang, kill or kill_in_save"),
              std::string::npos);
  }
}

TEST(TrainSettingsTest, AFaultFiresOnlyOnItsDeviceAndStep) {
  const TrainSettings s = settings_for({"debug.fault=hang", "debug.fault_step=3", "debug.fault_device=2"});
  using Kind = FaultInjection::Kind;
  EXPECT_TRUE(s.fault.fires(Kind::hang, 3, 2));
  EXPECT_FALSE(s.fault.fires(Kind::hang, 3, 1));
  EXPECT_FALSE(s.fault.fires(Kind::hang, 4, 2));
  EXPECT_FALSE(s.fault.fires(Kind::throw_error, 3, 2));
}

}  // namespace
}  // namespace meshtrain::train
