// training_state_test.cpp — training_state.json round trips (in memory and through a checkpoint folder with its
// completion marker), malformed files named, and the config fingerprint with the changed keys it names.
#include "meshtrain/checkpoint/training_state.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"
#include "meshtrain/settings/settings.hpp"

#include <gtest/gtest.h>

#include "scratch_dir.hpp"

#include <fstream>

namespace fs = std::filesystem;

namespace meshtrain::checkpoint {
namespace {

// The trajectory keys of the shipped defaults with `overrides` on top.
std::map<std::string, std::string> trajectory_of(const std::vector<std::string>& overrides) {
  return settings::Settings::from_config(config::Config::load(config::default_config_dir(), overrides)).trajectory();
}

TrainingState sample_state() {
  return TrainingState::at_step(trajectory_of({"seed=7"}), 7, 20, 40960, {{"epoch", 1}, {"step", 3}});
}

TEST(TrainingStateTest, JsonRoundTrip) {
  const TrainingState state = sample_state();
  EXPECT_EQ(state.seed, 7u);
  EXPECT_EQ(state.config_fingerprint.size(), 8u);
  const TrainingState back = TrainingState::from_json(state.to_json(), "mem");
  EXPECT_EQ(back.step, 20);
  EXPECT_EQ(back.tokens_seen, 40960);
  EXPECT_EQ(back.seed, 7u);
  EXPECT_EQ(back.data_state, state.data_state);
  EXPECT_EQ(back.config_fingerprint, state.config_fingerprint);
  EXPECT_EQ(back.config, state.config);
}

TEST(TrainingStateTest, WrittenBesideACheckpointAndVerified) {
  meshtrain::testing::ScratchDir scratch("meshtrain_training_state_test");
  const fs::path dir = scratch.path() / "step-000020";
  const CheckpointFile entry = write_training_state(dir, sample_state());
  EXPECT_EQ(entry.name, kTrainingStateFile);
  EXPECT_EQ(entry.bytes, fs::file_size(dir / kTrainingStateFile));
  write_completion_marker(dir, {entry});
  EXPECT_NO_THROW(verify_checkpoint_files(dir));
  EXPECT_EQ(read_training_state(dir).step, 20);

  std::ofstream(dir / kTrainingStateFile, std::ios::app) << " ";  // damage it
  EXPECT_THROW(verify_checkpoint_files(dir), UserError);
}

TEST(TrainingStateTest, MalformedStateIsNamed) {
  meshtrain::testing::ScratchDir scratch("meshtrain_training_state_bad_test");
  auto error_of = [&](const std::string& text) -> std::string {
    std::ofstream(scratch.path() / kTrainingStateFile) << text;
    try {
      read_training_state(scratch.path());
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{}").find("not a meshtrain training state"), std::string::npos);
  // A "format" that is not a string (found by fuzz.training_state: json.value() threw a raw type_error).
  EXPECT_NE(error_of(R"({"format": 1})").find("not a meshtrain training state"), std::string::npos);
  nlohmann::json json = sample_state().to_json();
  json["version"] = 99;
  EXPECT_NE(error_of(json.dump()).find("version 99"), std::string::npos);
  json = sample_state().to_json();
  json.erase("step");
  const std::string missing = error_of(json.dump());
  EXPECT_NE(missing.find("'step' is missing"), std::string::npos) << missing;
  EXPECT_NE(missing.find(kTrainingStateFile), std::string::npos) << missing;
  EXPECT_THROW(read_training_state(scratch.path() / "nowhere"), UserError);
}

TEST(TrainingStateTest, IntegerFieldsMustBeIntegersInRange) {
  // get<int64_t>() truncated 1e300 (undefined behaviour) and wrapped 2^64 - 1 to -1.
  meshtrain::testing::ScratchDir scratch("meshtrain_training_state_range_test");
  auto error_with = [&](const char* field, const nlohmann::json& value) -> std::string {
    nlohmann::json json = sample_state().to_json();
    json[field] = value;
    std::ofstream(scratch.path() / kTrainingStateFile) << json.dump();
    try {
      read_training_state(scratch.path());
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  const std::string file = (scratch.path() / kTrainingStateFile).string();
  EXPECT_EQ(error_with("step", 1e300), file + ": the field 'step' is 1e+300, expected an integer in "
                                              "[-9223372036854775808, 9223372036854775807]");
  EXPECT_NE(error_with("tokens_seen", 18446744073709551615ull).find("the field 'tokens_seen' is 18446744073709551615"),
            std::string::npos);
  EXPECT_NE(error_with("seed", -1).find("the field 'seed' is -1, expected an integer in [0, 18446744073709551615]"),
            std::string::npos);
  EXPECT_NE(error_with("version", "1").find("the field 'version' is \"1\""), std::string::npos);
  EXPECT_EQ(error_with("step", 5), "");
}

TEST(TrainingStateTest, FingerprintIgnoresPathsLoggingAndMeshButNotTheTrajectory) {
  const std::string base = config_fingerprint(trajectory_of({}));
  EXPECT_EQ(config_fingerprint(trajectory_of({"output_dir=elsewhere", "logging_steps=1",
                                                             "checkpoint.keep=5", "ici_mesh.fsdp=2"})),
            base);
  EXPECT_NE(config_fingerprint(trajectory_of({"optimizer.learning_rate=0.001"})), base);
  EXPECT_NE(config_fingerprint(trajectory_of({"model.num_hidden_layers=3"})), base);
}

TEST(TrainingStateTest, ConfigChangesNameEachChangedKey) {
  const TrainingState state = TrainingState::at_step(trajectory_of({}), 42, 10, 0, nullptr);
  EXPECT_TRUE(config_changes(state, trajectory_of({"output_dir=elsewhere"})).empty());
  const auto changes = config_changes(state, trajectory_of({"optimizer.learning_rate=0.001", "seed=1"}));
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], "optimizer.learning_rate: 3.0e-3 -> 0.001");
  EXPECT_EQ(changes[1], "seed: 42 -> 1");
}

}  // namespace
}  // namespace meshtrain::checkpoint
