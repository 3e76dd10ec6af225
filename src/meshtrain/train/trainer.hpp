// trainer.hpp — one host's training run (Trainer: set-up on the host's main thread) and each local device's part of
// it (DeviceTrainer: the model's shards, the optimizer, and the steps), in the spirit of torchtitan's train.py.
// train_host builds one Trainer and runs a DeviceTrainer on every local device.
//
// Per step, on every device (all devices run the same program):
//   batch      DataPipeline::next: this device's rows of the global batch (no communication)
//   micro      gradient_accumulation_steps forward/backward passes over slices of those rows; the loss of each is
//              (sum of its token losses) / (global tokens in the step x the devices holding each row), so the summed
//              gradients are those of the global mean
//   gradients  reduce-scattered over fsdp per layer during backward, summed over their replicas after the last pass
//   clip       by the global norm over every shard; AdamW on this device's shards; the learning-rate schedule
//   loss       the local sums all-reduced over the batch axes: the global mean, the same number on every host
//   checkpoint every checkpoint.save_steps, at the end and on a stop signal, every device writing its files
#pragma once

#include "meshtrain/checkpoint/training_state.hpp"
#include "meshtrain/data/pipeline.hpp"
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/parallel/parallel_model.hpp"
#include "meshtrain/runtime/host_runtime.hpp"
#include "meshtrain/settings/settings.hpp"
#include "meshtrain/train/adamw.hpp"
#include "meshtrain/train/memory_plan.hpp"
#include "meshtrain/train/metrics.hpp"
#include "meshtrain/train/lr_schedule.hpp"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::train {

// One host's run. The constructor finds the resume point (the newest complete checkpoint,
// verified), opens the data pipelines, checks the model against the data and the memory plan against the host, all
// on the host's main thread; UserError naming the key or file on bad input. `start()` (after the hosts agreed on
// job_facts()) opens the metrics and the source of the initial weights. Its DeviceTrainers share it: everything
// they read is immutable or thread-safe (the pipelines' next(), const reads of the checkpoint's weights); the
// metrics logger is used by each host's reporting device only.
class Trainer {
 public:
  // `mesh` must outlive the Trainer.
  Trainer(const settings::Settings& settings, const mesh::Mesh& mesh, int host, int threads_per_device);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // What this host would run, for the hosts to compare before any collective (runtime/job_agreement.hpp); host 0's
  // also carry what it decides for all (the MFU denominator).
  runtime::JobFacts job_facts() const;
  // Logs the run and opens its metrics with what host 0 decided (`agreed`: host 0's job_facts()); false (after
  // saying so) when the resume point is already at max_steps.
  bool start(const runtime::JobFacts& agreed);
  // The host's closing lines: where training stopped, the memory used against the plan, the plot and TensorBoard.
  void finish();

  const settings::Settings& settings() const { return settings_; }
  const mesh::Mesh& mesh() const { return mesh_; }
  int host() const { return host_; }
  // The first step this run trains: the resume point's step + 1, or 1.
  int64_t first_step() const { return start_step_ + 1; }
  // The step every device stopped after on a stop signal (runtime/preemption.hpp), 0 if none came.
  int64_t preempted_at_step() const { return preempted_at_step_.load(); }

 private:
  friend class DeviceTrainer;

  const settings::Settings settings_;
  const mesh::Mesh& mesh_;
  int host_;
  int threads_per_device_;
  LrSchedule schedule_;
  std::optional<std::filesystem::path> resume_dir_;  // the checkpoint resumed from
  std::optional<checkpoint::TrainingState> resume_state_;
  int64_t start_step_ = 0;
  std::unique_ptr<data::DataPipeline> pipeline_, eval_pipeline_;  // eval_pipeline_: null without evaluation
  MemoryPlan memory_plan_;
  nlohmann::json mfu_peak_;  // host 0's PeakFlops (null on the other hosts)
  std::vector<std::string> pipeline_lines_;  // the stages and the schedule's timeline (none without a pipeline)
  std::unique_ptr<MetricsLogger> metrics_;
  std::optional<model::CheckpointTensors> checkpoint_weights_;  // the initial weights, when they come from files
  model::SliceSource initial_values_;
  std::atomic<int64_t> preempted_at_step_{0};
};

// One device's part of a run: its shards of the model (built from the run's initial weights) and of the optimizer
// (restored at a resume point). Built and used on the device's thread; every device of the mesh calls the same
// methods in the same order (they communicate).
class DeviceTrainer {
 public:
  DeviceTrainer(Trainer& run, runtime::DeviceContext& ctx);

  // Trains steps first_step()..max_steps: each step, evaluation when due, saving when due; stops after the step at
  // which any host got a stop signal (saved). The reporting device of each host logs the metrics.
  void train();

  // One optimizer step on the next global batch; returns its metrics (the same loss on every device).
  StepMetrics train_step(int64_t step);
  // The mean loss over one round of held-out batches with the current weights (forward only, on the training mesh
  // and read plan), the same on every device. The run must evaluate (eval.every_steps > 0).
  EvalMetrics evaluate(int64_t step);
  // Saves the checkpoint of `step` (every device writes its files; device 0 publishes the folder and prunes old
  // ones); `next` is the data cursor the run continues at.
  void save(int64_t step, const data::DataCursor& next);

  parallel::ParallelModel& model() { return *model_; }

 private:
  Trainer& run_;
  const settings::Settings& settings_;
  runtime::DeviceContext& ctx_;
  bool reporter_;  // this host's first device: logs metrics, releases the freed heap
  std::optional<parallel::ParallelModel> model_;
  std::optional<AdamW> optimizer_;
  data::DataCursor last_cursor_;  // of the last batch trained on
};

// Trains as the settings say on this host's devices; returns when max_steps is reached or after a stop signal.
// Resumes from the newest complete checkpoint under <output_dir>/checkpoints when checkpoint.resume is true (on any
// mesh).
void train_host(const settings::Settings& settings, const mesh::Mesh& mesh, int host, runtime::HostRuntime& runtime);

}  // namespace meshtrain::train
