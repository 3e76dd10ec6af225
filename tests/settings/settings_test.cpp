// settings_test.cpp — the typed settings made once from the config: values, checks naming the key, each key's
// declared attributes (what changes results, what hosts may set differently), every shipped config fully declared.
#include "meshtrain/settings/settings.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"

#include <gtest/gtest.h>

#include "scratch_dir.hpp"

#include <fstream>

namespace fs = std::filesystem;

namespace meshtrain::settings {
namespace {

Settings settings_for(const std::vector<std::string>& overrides) {
  return Settings::from_config(config::Config::load(config::default_config_dir(), overrides));
}

// The UserError's message for `overrides`, "" when they are accepted.
std::string error_of(const std::vector<std::string>& overrides) {
  try {
    settings_for(overrides);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(SettingsTest, ReadsTheKeys) {
  const Settings s = settings_for({"max_steps=7", "output_dir=/tmp/x", "compute_dtype=bfloat16", "seed=9",
                                   "ici_mesh.fsdp=4", "dcn_mesh.data=2", "eval.every_steps=5", "log_level=debug"});
  EXPECT_EQ(s.max_steps, 7);
  EXPECT_EQ(s.checkpoints_dir(), fs::path("/tmp/x/checkpoints"));
  EXPECT_EQ(s.compute_dtype, ComputeDtype::bfloat16);
  EXPECT_EQ(s.seed, 9u);
  EXPECT_EQ(s.mesh.ici[mesh::Axis::fsdp], 4);
  EXPECT_EQ(s.mesh.dcn[mesh::Axis::data], 2);
  EXPECT_TRUE(s.eval.enabled());
  EXPECT_TRUE(s.eval.from_holdout());
  EXPECT_EQ(s.log_level, log::Level::debug);
  EXPECT_EQ(s.model.hidden_size, 64);  // llama-tiny, the default model
  EXPECT_EQ(s.debug.fault.kind, FaultInjection::Kind::none);
  EXPECT_EQ(s.lr_scheduler.decay, LrDecay::cosine);
  EXPECT_EQ(s.parallel.checkpoint_every, 0);
  EXPECT_EQ(settings_for({"activation_checkpointing=every_2"}).parallel.checkpoint_every, 2);
  EXPECT_NE(s.resolved_yaml().find("max_steps: 7"), std::string::npos) << s.resolved_yaml();
}

TEST(SettingsTest, TheTrajectoryHoldsWhatChangesResults) {
  const Settings s = settings_for({"seed=9", "output_dir=/tmp/x"});
  const std::map<std::string, std::string> trajectory = s.trajectory();
  EXPECT_EQ(trajectory.at("seed"), "9");
  EXPECT_EQ(trajectory.at("model.name"), "llama-tiny");
  EXPECT_EQ(trajectory.count("output_dir"), 0u);
  EXPECT_EQ(trajectory.count("ici_mesh.fsdp"), 0u);
  // A run may resume on another CPU, where auto takes the other path: the same numerics up to summation order.
  EXPECT_EQ(settings_for({"bf16_matmul=fp32_gemm"}).trajectory().count("bf16_matmul"), 0u);
  EXPECT_EQ(settings_for({"bf16_matmul=fp32_gemm"}).bf16_matmul, Bf16Matmul::fp32_gemm);
  EXPECT_EQ(s.bf16_matmul, Bf16Matmul::automatic);
}

TEST(SettingsTest, TrajectoryKeysChangeResultsAndAreTheSameOnEveryHost) {
  const Settings s = settings_for({});
  for (const char* key : {"seed", "global_batch_size", "optimizer.learning_rate", "model.hidden_size", "max_steps",
                          "moe.capacity_factor"}) {
    EXPECT_TRUE(s.attributes(key).changes_results) << key;
    EXPECT_FALSE(s.attributes(key).may_differ_between_hosts) << key;
  }
}

TEST(SettingsTest, LayoutAndBookkeepingKeysDoNotChangeResults) {
  const Settings s = settings_for({});
  for (const char* key : {"checkpoint.save_steps", "ici_mesh.fsdp", "dcn_mesh.data", "data.input_sharding",
                          "metrics.peak_gflops", "activation_checkpointing", "eval.every_steps",
                          "runtime.collective_timeout_s", "bf16_matmul"}) {
    EXPECT_FALSE(s.attributes(key).changes_results) << key;
    EXPECT_FALSE(s.attributes(key).may_differ_between_hosts) << key;
  }
}

TEST(SettingsTest, HostLocalKeysMayDifferBetweenHosts) {
  const Settings s = settings_for({});
  for (const char* key : {"output_dir", "log_level", "runtime.threads_per_device", "data.loader_threads",
                          "data.prefetch_steps", "dataset.path"})
    EXPECT_TRUE(s.attributes(key).may_differ_between_hosts) << key;
  EXPECT_TRUE(s.attributes("dataset.path").changes_results);  // each host names its copy; the content is compared
  const std::map<std::string, std::string> shared = s.host_shared();
  EXPECT_EQ(shared.count("output_dir"), 0u);
  EXPECT_EQ(shared.count("log_level"), 0u);
  EXPECT_EQ(shared.at("seed"), "42");
  EXPECT_EQ(shared.count("ici_mesh.fsdp"), 1u);
}

TEST(SettingsTest, EveryShippedConfigIsDeclaredWhole) {
  const fs::path dir = config::default_config_dir();
  for (const auto& entry : fs::directory_iterator(dir / "model")) {
    const std::string name = entry.path().stem().string();
    const config::Config config = config::Config::load(dir, {"model=" + name, "block_size=128"});
    const Settings s = Settings::from_config(config);  // a key nobody declared is a UserError
    for (const std::string& key : config.leaf_keys()) EXPECT_NO_THROW(s.attributes(key)) << name << ": " << key;
  }
}

TEST(SettingsTest, AKeyNothingReadsIsRefused) {
  testing::ScratchDir scratch("settings_test");
  fs::copy(config::default_config_dir(), scratch.path(), fs::copy_options::recursive);
  std::ofstream(scratch.path() / "model" / "odd.yaml", std::ios::app)
      << "vocab_size: 256\nhidden_size: 64\nintermediate_size: 128\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
         "sliding_window: 128\n";
  try {
    Settings::from_config(config::Config::load(scratch.path(), {"model=odd"}));
    FAIL() << "a key nothing reads was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("config key model.sliding_window is not one meshtrain reads"),
              std::string::npos)
        << e.what();
  }
}

TEST(SettingsTest, BadValuesNameTheKey) {
  EXPECT_NE(error_of({"max_steps=0"}).find("max_steps"), std::string::npos);
  EXPECT_NE(error_of({"compute_dtype=float16"}).find("compute_dtype=float16: expected float32 or bfloat16"),
            std::string::npos);
  const std::string bf16 = error_of({"bf16_matmul=bf16"});
  EXPECT_NE(bf16.find("bf16_matmul=bf16: expected auto"), std::string::npos) << bf16;
  EXPECT_NE(bf16.find("native"), std::string::npos) << bf16;
  EXPECT_NE(bf16.find("fp32_gemm"), std::string::npos) << bf16;
  EXPECT_NE(error_of({"debug.fault=explode"}).find("debug.fault=explode: expected none, throw, hang, kill or "
                                                   "kill_in_save"),
            std::string::npos);
  EXPECT_NE(error_of({"lr_scheduler.type=step"}).find("lr_scheduler.type=step: expected cosine, linear or constant"),
            std::string::npos);
  EXPECT_NE(error_of({"activation_checkpointing=every_0"}).find("activation_checkpointing=every_0"),
            std::string::npos);
  EXPECT_NE(error_of({"log_level=loud"}).find("loud"), std::string::npos);
  EXPECT_NE(error_of({"runtime.heartbeat_interval_s=0"}).find("runtime.heartbeat_interval_s"), std::string::npos);
  EXPECT_NE(error_of({"memory.cache_slack=-1"}).find("memory.cache_slack=-1"), std::string::npos);
  EXPECT_NE(error_of({"block_size=4096"}).find("max_position_embeddings"), std::string::npos);
  EXPECT_NE(error_of({"eval.every_steps=5", "eval.holdout_fraction=1.5"}).find("eval.holdout_fraction"),
            std::string::npos);
  EXPECT_EQ(error_of({"eval.holdout_fraction=1.5"}), "");  // not evaluating: the fraction is not used
  EXPECT_NE(error_of({"logging_steps=0"}).find("logging_steps"), std::string::npos);
  EXPECT_NE(error_of({"metrics.peak_gflops=-1"}).find("metrics.peak_gflops"), std::string::npos);
  EXPECT_NE(error_of({"gradient_accumulation_steps=0"}).find("gradient_accumulation_steps"), std::string::npos);
}

TEST(SettingsTest, AFaultFiresOnlyOnItsDeviceAndStep) {
  const Settings s = settings_for({"debug.fault=hang", "debug.fault_step=3", "debug.fault_device=2"});
  using Kind = FaultInjection::Kind;
  EXPECT_TRUE(s.debug.fault.fires(Kind::hang, 3, 2));
  EXPECT_FALSE(s.debug.fault.fires(Kind::hang, 3, 1));
  EXPECT_FALSE(s.debug.fault.fires(Kind::hang, 4, 2));
  EXPECT_FALSE(s.debug.fault.fires(Kind::throw_error, 3, 2));
}

}  // namespace
}  // namespace meshtrain::settings
