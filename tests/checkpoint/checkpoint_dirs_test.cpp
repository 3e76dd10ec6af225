// checkpoint_dirs_test.cpp — step folder names, choosing the newest complete checkpoint (an incomplete newer one
// skipped with a warning, a ".partial" one never a candidate), publishing a partial folder whole, and pruning old
// ones without ever touching the newest complete one.
#include "meshtrain/checkpoint/checkpoint_dirs.hpp"
#include "meshtrain/checkpoint/hf_directory.hpp"

#include <gtest/gtest.h>

#include "scratch_dir.hpp"

#include <fstream>

namespace fs = std::filesystem;

namespace meshtrain::checkpoint {
namespace {

class CheckpointDirsTest : public ::testing::Test {
 protected:
  // A step folder with a file in it, and the completion marker when `complete`.
  fs::path make(int64_t step, bool complete) {
    const fs::path dir = checkpoint_dir_for_step(root(), step);
    fs::create_directories(dir);
    std::ofstream(dir / "model.safetensors") << "weights";
    if (complete) std::ofstream(dir / kCompletionMarker) << "{\"files\": []}";
    return dir;
  }
  const fs::path& root() const { return scratch_.path(); }

  meshtrain::testing::ScratchDir scratch_{"meshtrain_checkpoint_dirs_test"};
};

TEST_F(CheckpointDirsTest, NamesAndParsesStepFolders) {
  EXPECT_EQ(checkpoint_dir_for_step("out/checkpoints", 20), fs::path("out/checkpoints/step-000020"));
  EXPECT_EQ(checkpoint_dir_for_step("c", 1234567).filename(), "step-1234567");
  EXPECT_EQ(checkpoint_step("c/step-000020"), 20);
  EXPECT_EQ(checkpoint_step("step-1234567"), 1234567);
  EXPECT_EQ(checkpoint_step("step-"), std::nullopt);
  EXPECT_EQ(checkpoint_step("step-12a"), std::nullopt);
  EXPECT_EQ(checkpoint_step("latest"), std::nullopt);
  EXPECT_EQ(checkpoint_step("c/step-000020.partial"), std::nullopt);
  EXPECT_EQ(partial_checkpoint_dir("c/step-000020"), fs::path("c/step-000020.partial"));
}

TEST_F(CheckpointDirsTest, NoCheckpointsGivesNothing) {
  EXPECT_EQ(newest_complete_checkpoint(root() / "missing"), std::nullopt);
  EXPECT_EQ(newest_complete_checkpoint(root()), std::nullopt);
}

TEST_F(CheckpointDirsTest, NewestCompleteSkipsAnIncompleteNewerOneWithAWarning) {
  make(10, true);
  const fs::path twenty = make(20, true);
  make(30, false);
  fs::create_directories(root() / "notes");  // other folders are ignored
  ::testing::internal::CaptureStderr();
  const auto newest = newest_complete_checkpoint(root());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(newest, twenty);
  EXPECT_NE(err.find("step-000030 is incomplete"), std::string::npos) << err;
  EXPECT_NE(err.find("WARNING"), std::string::npos) << err;
}

TEST_F(CheckpointDirsTest, StepsCompareAsNumbersNotNames) {
  make(999999, true);
  const fs::path newest = make(1000000, true);
  EXPECT_EQ(newest_complete_checkpoint(root()), newest);
}

TEST_F(CheckpointDirsTest, RemovesOldCompleteAndAbandonedIncompleteOnes) {
  make(5, false);
  make(10, true);
  make(20, true);
  make(30, true);
  make(40, false);  // newer than every complete one: maybe being written, left alone
  ::testing::internal::CaptureStderr();
  remove_old_checkpoints(root(), 2);
  ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(checkpoint_dir_for_step(root(), 5)));
  EXPECT_FALSE(fs::exists(checkpoint_dir_for_step(root(), 10)));
  EXPECT_TRUE(fs::exists(checkpoint_dir_for_step(root(), 20)));
  EXPECT_TRUE(fs::exists(checkpoint_dir_for_step(root(), 30)));
  EXPECT_TRUE(fs::exists(checkpoint_dir_for_step(root(), 40)));
}

TEST_F(CheckpointDirsTest, KeepOneKeepsTheNewestAndKeepZeroKeepsAll) {
  make(10, true);
  make(20, true);
  remove_old_checkpoints(root(), 0);
  EXPECT_TRUE(fs::exists(checkpoint_dir_for_step(root(), 10)));
  ::testing::internal::CaptureStderr();
  remove_old_checkpoints(root(), 1);
  ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(checkpoint_dir_for_step(root(), 10)));
  EXPECT_EQ(newest_complete_checkpoint(root()), checkpoint_dir_for_step(root(), 20));
}

TEST_F(CheckpointDirsTest, APartialFolderIsNeverACandidateAndIsCleanedAfterASave) {
  const fs::path ten = make(10, true);
  const fs::path partial = partial_checkpoint_dir(checkpoint_dir_for_step(root(), 20));
  fs::create_directories(partial);
  std::ofstream(partial / kCompletionMarker) << "{\"files\": []}";  // even a marker does not make it one
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(newest_complete_checkpoint(root()), ten);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("step-000020.partial was interrupted"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  remove_old_checkpoints(root(), 0);
  ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_TRUE(fs::exists(ten));
}

TEST_F(CheckpointDirsTest, ASaveStartsFromAnEmptyPartialFolderAndReplacesAnOlderFolderWhole) {
  const fs::path dir = make(20, true);
  std::ofstream(dir / "optimizer-00001-of-00002.safetensors") << "stale";
  fs::create_directories(partial_checkpoint_dir(dir));
  std::ofstream(partial_checkpoint_dir(dir) / "optimizer-00002-of-00002.safetensors") << "stale";
  ::testing::internal::CaptureStderr();
  const fs::path partial = begin_partial_checkpoint(dir);
  EXPECT_TRUE(fs::is_empty(partial));
  std::ofstream(partial / kCompletionMarker) << "{\"files\": []}";
  publish_checkpoint(dir);
  ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(partial));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{kCompletionMarker});
}

}  // namespace
}  // namespace meshtrain::checkpoint
