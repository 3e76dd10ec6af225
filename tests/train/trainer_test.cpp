// trainer_test.cpp — the Trainer's steps on simulated devices (tests/simulated_devices.hpp): a run of two hosts x two
// devices (one Trainer per host, a DeviceTrainer per device) gives every device the same loss and grad norm at each
// step, equal to those of one device, and evaluates to the same held-out loss; bad settings stop at start-up.
#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"
#include "meshtrain/token_shards/shard_writer.hpp"
#include "meshtrain/train/trainer.hpp"
#include "scratch_dir.hpp"
#include "simulated_devices.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <mutex>

namespace meshtrain::train {
namespace {

namespace fs = std::filesystem;
using testing::axis_sizes;

// A byte-token dataset (vocabulary 256, as llama-tiny's) of one shard: the same English sentence, many documents.
void write_byte_shards(const fs::path& dir) {
  fs::create_directories(dir);
  token_shards::ShardIndex index;
  index.tokenizer = {"byte", "byte", "test:256", 256, -1};
  index.token_bytes = 2;
  token_shards::ShardWriter writer(dir / "shard_00000.tok", 2, "byte", "test:256");
  const std::string text = "Call me Ishmael. Some years ago, never mind how long precisely, I went to sea. ";
  for (int d = 0; d < 40; ++d) {
    std::vector<uint32_t> document(text.begin(), text.end());
    writer.append_document(document.data(), document.size());
  }
  index.shards.push_back(writer.finish());
  index.total_tokens = index.shards.back().tokens;
  index.total_documents = index.shards.back().documents;
  std::ofstream(dir / token_shards::kIndexFileName) << token_shards::index_to_json(index);
}

struct StepRecord {
  std::vector<double> losses, grad_norms;
  double eval_loss = 0;
  int64_t tokens = 0;
};

class TrainerTest : public ::testing::Test {
 protected:
  testing::ScratchDir scratch_{"trainer_test"};

  settings::Settings settings_for(const std::vector<std::string>& extra) const {
    write_byte_shards(scratch_.path() / "data");
    std::vector<std::string> overrides = {"model=llama-tiny",
                                          "dataset.path=" + (scratch_.path() / "data").string(),
                                          "output_dir=" + (scratch_.path() / "out").string(),
                                          "global_batch_size=4",
                                          "block_size=16",
                                          "max_steps=3",
                                          "optimizer.learning_rate=0.01",
                                          "lr_scheduler.warmup_steps=1",
                                          "eval.every_steps=3",
                                          "eval.batches=1",
                                          "eval.holdout_fraction=0.2",
                                          "metrics.peak_gflops=1",
                                          "metrics.tensorboard=false",
                                          "checkpoint.resume=false"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return settings::Settings::from_config(config::Config::load(config::default_config_dir(), overrides));
  }

  // Steps 1..3 and one evaluation on every device of `mesh`; the records per device.
  std::vector<StepRecord> run(const mesh::Mesh& mesh, const std::vector<std::string>& extra = {}) const {
    const settings::Settings settings = settings_for(extra);
    std::vector<std::unique_ptr<Trainer>> trainers;
    for (int host = 0; host < mesh.hosts(); ++host) {
      trainers.push_back(std::make_unique<Trainer>(settings, mesh, host, 1));
      EXPECT_TRUE(trainers.back()->start(trainers.front()->job_facts()));
    }
    std::vector<StepRecord> records(mesh.num_devices());
    testing::expect_no_failures(testing::run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
      DeviceTrainer device(*trainers[ctx.host()], ctx);
      StepRecord& record = records[ctx.device()];
      for (int64_t step = 1; step <= 3; ++step) {
        const StepMetrics metrics = device.train_step(step);
        EXPECT_EQ(metrics.step, step);
        record.losses.push_back(metrics.loss);
        record.grad_norms.push_back(metrics.grad_norm);
        record.tokens = metrics.tokens;
      }
      record.eval_loss = device.evaluate(3).loss;
    }));
    return records;
  }
};

TEST_F(TrainerTest, EveryDeviceReportsTheOneDeviceLossAtEachStep) {
  const std::vector<StepRecord> one =
      run(mesh::Mesh::create(axis_sizes(1, 1, 1, 1), axis_sizes(1, 1, 1, 1), 1, 1));
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(one[0].losses.size(), 3u);
  EXPECT_EQ(one[0].tokens, 4 * 16);
  // Untrained, a byte model starts near ln(256) = 5.55; three steps at lr 0.01 lower it.
  EXPECT_NEAR(one[0].losses[0], std::log(256.0), 0.3);
  EXPECT_LT(one[0].losses[2], one[0].losses[0]);
  EXPECT_TRUE(std::isfinite(one[0].eval_loss));

  const std::vector<StepRecord> mesh4 =
      run(mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 2, 1, 1), 2, 2));  // fsdp over 2 hosts x 2
  ASSERT_EQ(mesh4.size(), 4u);
  for (size_t device = 0; device < mesh4.size(); ++device) {
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(mesh4[device].losses[k], mesh4[0].losses[k]) << "device " << device << " step " << k + 1;
      EXPECT_NEAR(mesh4[device].losses[k], one[0].losses[k], 1e-4) << "device " << device << " step " << k + 1;
      EXPECT_NEAR(mesh4[device].grad_norms[k], one[0].grad_norms[k], 1e-3 * one[0].grad_norms[k]);
    }
    EXPECT_EQ(mesh4[device].eval_loss, mesh4[0].eval_loss);
    EXPECT_NEAR(mesh4[device].eval_loss, one[0].eval_loss, 1e-4);
  }
}

TEST_F(TrainerTest, DocumentMaskingKeepsTheOneDeviceLossWithFsdpAndCheckpointing) {
  // Rows of 32 tokens over documents of 80: most rows hold the end of one and the start of the next.
  const std::vector<std::string> masked = {"block_size=32", "data.document_mask=true"};
  const mesh::Mesh one_device = mesh::Mesh::create(axis_sizes(1, 1, 1, 1), axis_sizes(1, 1, 1, 1), 1, 1);
  const std::vector<StepRecord> one = run(one_device, masked);
  const std::vector<StepRecord> unmasked = run(one_device, {"block_size=32"});
  EXPECT_NE(one[0].losses, unmasked[0].losses);  // the mask changes what is computed

  std::vector<std::string> checkpointed = masked;
  checkpointed.push_back("activation_checkpointing=full");
  const std::vector<StepRecord> mesh4 =
      run(mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 2, 1, 1), 2, 2), checkpointed);
  for (size_t device = 0; device < mesh4.size(); ++device) {
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(mesh4[device].losses[k], one[0].losses[k], 1e-4) << "device " << device << " step " << k + 1;
      EXPECT_NEAR(mesh4[device].grad_norms[k], one[0].grad_norms[k], 1e-3 * one[0].grad_norms[k]);
    }
    EXPECT_NEAR(mesh4[device].eval_loss, one[0].eval_loss, 1e-4);
  }
}

TEST_F(TrainerTest, AccumulationThatDoesNotDivideTheDeviceRowsStopsAtStartUp) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1), 1, 2);
  try {
    Trainer trainer(settings_for({"gradient_accumulation_steps=4"}), mesh, 0, 1);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps=4 does not divide the 2 rows each device holds"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::train
