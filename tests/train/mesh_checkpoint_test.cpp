// mesh_checkpoint_test.cpp — mesh checkpoints on simulated meshes (one thread per device): a save is published whole
// (written into a fresh ".partial" folder, renamed when complete), so the files of an interrupted save on another
// mesh are never read, whatever the folder held before; a save that fails removes its partial folder and keeps the
// older checkpoint.
#include "meshtrain/checkpoint/checkpoint_dirs.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/model/parameter_init.hpp"
#include "meshtrain/train/mesh_checkpoint.hpp"

#include "scratch_dir.hpp"
#include "simulated_devices.hpp"
#include "tiny_llama.hpp"

#include <gtest/gtest.h>

#include <set>

namespace fs = std::filesystem;

namespace meshtrain::train {
using namespace meshtrain::checkpoint;
namespace {

using testing::tiny_llama_config;

mesh::Mesh fsdp_mesh(int devices) {
  return mesh::Mesh::create(testing::axis_sizes(1, devices, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, devices);
}

// One device's model and optimizer, its moments filled with `moment`.
struct DeviceState {
  DeviceState(runtime::DeviceContext& ctx, float moment)
      : model(std::make_shared<model::LlamaForCausalLM>(tiny_llama_config()), ctx, parallel::ParallelOptions{},
              model::initial_value_source(tiny_llama_config(), 3)),
        optimizer(AdamWOptions{}, model.parameter_shards()) {
    for (auto* moments : {&optimizer.exp_avg(), &optimizer.exp_avg_sq()})
      for (at::Tensor& m : *moments) m.fill_(moment);
  }
  parallel::ParallelModel model;
  AdamW optimizer;
};

TrainingState state_at(int64_t step) { return TrainingState::at_step({{"seed", "1"}}, 1, step, step * 64, {}); }

// Saves `step` under `root` from every device of fsdp=`devices`, moments = `moment`. Returns each device's failure
// ("" if none).
std::vector<std::string> save_step(const fs::path& root, int64_t step, int devices, float moment) {
  return testing::run_on_all_devices(fsdp_mesh(devices), [&](runtime::DeviceContext& ctx) {
    DeviceState device(ctx, moment);
    save_mesh_checkpoint(checkpoint_dir_for_step(root, step), ctx, device.model, device.optimizer, state_at(step));
  });
}

// The moments loaded from `dir` on one device: every element must be `moment`.
void expect_loaded_moments(const fs::path& dir, float moment) {
  testing::expect_no_failures(testing::run_on_all_devices(fsdp_mesh(1), [&](runtime::DeviceContext& ctx) {
    DeviceState device(ctx, -1);
    load_optimizer_state(dir, device.model, device.optimizer);
    for (auto* moments : {&device.optimizer.exp_avg(), &device.optimizer.exp_avg_sq()})
      for (const at::Tensor& m : *moments) EXPECT_TRUE(m.eq(moment).all().item<bool>());
  }));
}

std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

class MeshCheckpointTest : public ::testing::Test {
 protected:
  const fs::path& root() const { return scratch_.path(); }
  meshtrain::testing::ScratchDir scratch_{"meshtrain_mesh_checkpoint_test"};
};

// Issue 34's sequence: a save on 2 devices dies before its marker; the run resumes on 1 device and saves that step
// again. The step's folder holds the second save's files only, and loads.
TEST_F(MeshCheckpointTest, AnInterruptedSaveOnAnotherMeshLeavesNothingBehind) {
  testing::expect_no_failures(save_step(root(), 4, 2, 2.0f));
  const fs::path dir = checkpoint_dir_for_step(root(), 4);
  fs::rename(dir, partial_checkpoint_dir(dir));  // what a death before the rename leaves
  fs::remove(partial_checkpoint_dir(dir) / checkpoint::kCompletionMarker);
  EXPECT_EQ(newest_complete_checkpoint(root()), std::nullopt);

  testing::expect_no_failures(save_step(root(), 4, 1, 1.0f));
  EXPECT_FALSE(fs::exists(partial_checkpoint_dir(dir)));
  const std::set<std::string> want = {"config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json",
                                      "optimizer-00001-of-00001.safetensors", "training_state.json",
                                      checkpoint::kCompletionMarker};
  EXPECT_EQ(files_in(dir), want);
  EXPECT_EQ(newest_complete_checkpoint(root()), dir);
  checkpoint::verify_checkpoint_files(dir);
  expect_loaded_moments(dir, 1.0f);
}

// A complete folder with other files beside the ones its marker lists (as an older meshtrain's save left them):
// only the listed files are read.
TEST_F(MeshCheckpointTest, LoadsReadOnlyTheFilesTheMarkerLists) {
  testing::expect_no_failures(save_step(root(), 4, 2, 2.0f));
  const fs::path two = checkpoint_dir_for_step(root(), 4);
  testing::expect_no_failures(save_step(root(), 5, 1, 1.0f));
  const fs::path one = checkpoint_dir_for_step(root(), 5);
  for (const char* name : {"optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    fs::copy_file(two / name, one / name);
  expect_loaded_moments(one, 1.0f);
  checkpoint::verify_checkpoint_files(one);
  testing::expect_no_failures(testing::run_on_all_devices(fsdp_mesh(1), [&](runtime::DeviceContext&) {
    model::CheckpointTensors::weights(one, tiny_llama_config(), checkpoint::Verify::against_marker);
  }));
}

// A save of a step whose complete folder exists (a run started over) replaces it whole.
TEST_F(MeshCheckpointTest, ASaveReplacesAnOlderFolderOfItsStep) {
  testing::expect_no_failures(save_step(root(), 4, 2, 2.0f));
  testing::expect_no_failures(save_step(root(), 4, 1, 1.0f));
  const fs::path dir = checkpoint_dir_for_step(root(), 4);
  EXPECT_EQ(files_in(dir).count("optimizer-00001-of-00002.safetensors"), 0u);
  expect_loaded_moments(dir, 1.0f);
}

// A device that cannot write its part (a full disk) fails the save with an Error (a runtime failure, not a usage
// error) naming the folder; the partial folder is gone and the older checkpoint is still the one to resume from.
TEST_F(MeshCheckpointTest, AFailedSaveRemovesItsPartialFolderAndKeepsTheOlderCheckpoint) {
  testing::expect_no_failures(save_step(root(), 2, 1, 1.0f));
  bool usage_error = false;
  const std::vector<std::string> failures = testing::run_on_all_devices(fsdp_mesh(1), [&](runtime::DeviceContext& ctx) {
    DeviceState device(ctx, 2.0f);
    try {
      save_mesh_checkpoint(checkpoint_dir_for_step(root(), 4), ctx, device.model, device.optimizer, state_at(4), [] {
        throw UserError("writing optimizer-00001-of-00001.safetensors.tmp failed after 0 bytes: No space left");
      });
    } catch (const UserError&) {
      usage_error = true;
      throw;
    }
  });
  EXPECT_FALSE(usage_error);
  EXPECT_NE(failures[0].find("saving checkpoint " + checkpoint_dir_for_step(root(), 4).string() + " failed: writing"),
            std::string::npos)
      << failures[0];
  EXPECT_FALSE(fs::exists(partial_checkpoint_dir(checkpoint_dir_for_step(root(), 4))));
  EXPECT_FALSE(fs::exists(checkpoint_dir_for_step(root(), 4)));
  EXPECT_EQ(newest_complete_checkpoint(root()), checkpoint_dir_for_step(root(), 2));
  expect_loaded_moments(checkpoint_dir_for_step(root(), 2), 1.0f);
}

}  // namespace
}  // namespace meshtrain::train
