// pipeline.hpp — DataPipeline: the data path of one host, from the settings to each device's sharded batch (stages,
// logs and the resume state: docs/data.md).
//
//   token shards --TokenDataset--> samples --GlobalSampler--> global batch (epoch, step) --ReadPlan--> this host's
//   rows --HostLoader--> host-local batch (background threads) --next()--> GlobalTensors, one shard per local device
//
// next() is the device loader: each local device cuts its shard out of the host-local batch with zero collectives.
// The data state is one cursor plus what identifies the dataset, not the mesh, so a run can resume on another mesh
// or host count. An evaluation pipeline (Purpose::evaluation) is the same path over the held-out samples.
#pragma once

#include "meshtrain/data/dataset.hpp"
#include "meshtrain/data/global_sampler.hpp"
#include "meshtrain/data/host_loader.hpp"
#include "meshtrain/data/read_plan.hpp"
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/settings/settings.hpp"
#include "meshtrain/sharding/global_tensor.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::data {

struct DeviceBatch {
  // int32 [global_batch_size, block_size], spec = data.input_sharding; with the sequence split over context > 1
  // its sequence dimension is in load-balanced order (read_plan.hpp): a device's local() holds its context rank's
  // two chunks of each of its rows, in that order.
  sharding::GlobalTensor input_ids;
  sharding::GlobalTensor labels;     // int32, same shape/spec/order: the next token of each input in its natural row
  DataCursor cursor;                 // which global batch this is
  double wait_seconds = 0;           // how long this call blocked waiting for the host loader
  // int32, same shape/spec/order: each input token's document number in its whole row (data.document_mask), else
  // none.
  std::optional<sharding::GlobalTensor> document_ids;
};

class DataPipeline {
 public:
  enum class Purpose { training, evaluation };

  // Opens the dataset of the settings (dataset.path, block_size, global_batch_size, seed, data.*, debug.*), builds
  // this host's read plan on `mesh` (which must outlive the pipeline), logs the plan and torchprime's
  // `Minibatch dataloading: True|False` line, and starts prefetching global batches in background threads: from the
  // first batch, or where `saved_state` (a checkpoint's data state, state()) says, after check_state accepted it.
  // UserError on bad input (names the key/file). An evaluation pipeline starts at its first batch
  // (`saved_state` null), logs one line and no debug lines.
  DataPipeline(const settings::Settings& settings, const mesh::Mesh& mesh, int host,
               const nlohmann::json* saved_state, Purpose purpose = Purpose::training);
  ~DataPipeline();  // stops the threads cleanly
  DataPipeline(const DataPipeline&) = delete;
  DataPipeline& operator=(const DataPipeline&) = delete;

  // Called by every local device thread of this host once per training step, in order (thread-safe; all local
  // devices get the same sequence of cursors). Builds this device's GlobalTensors from the host-local batch: zero
  // collectives. Logs the instrumentation lines when debug.data_shapes is on.
  DeviceBatch next(runtime::DeviceContext& ctx);

  int64_t vocab_size() const;  // of the dataset's tokenizer
  std::string tokenizer_fingerprint() const;
  int64_t num_samples() const;  // of the dataset, held-out ones included
  const SampleRange& samples() const { return sampler_.samples(); }  // the ones this pipeline serves
  int64_t batches_per_epoch() const;  // for an evaluation pipeline: the batches of one evaluation
  // How many devices of the batch axes hold each row of a batch (mesh::MeshRoles::row_replicas of the input
  // sharding): a sum over them counts each row that many times.
  int64_t row_replicas() const { return row_replicas_; }
  // The input batch's spec (data.input_sharding on this mesh: input_sharding()).
  const sharding::PartitionSpec& spec() const { return spec_; }
  // The rows of a global batch each device holds (each with block_size / context of its tokens).
  int64_t rows_per_device() const { return plan_.devices.at(0).count; }
  // Where this pipeline started: the first batch, or the saved state's cursor.
  const DataCursor& start_cursor() const { return start_; }
  // The cursor of the batch after the one at `taken` (the next epoch's first after an epoch's last).
  DataCursor cursor_after(const DataCursor& taken) const;

  // The data state to store in a checkpoint: the cursor of the next batch to train on plus what identifies the
  // dataset and the batch order (tokenizer fingerprint, token count, shard files with counts and CRC-32C,
  // block_size, global_batch_size, seed, the range of samples trained on).
  nlohmann::json state(const DataCursor& next) const;
  // CRC-32C of what identifies the batches (state() without the cursor), 8 hex digits: equal on every host of a job.
  std::string fingerprint() const;
  // The cursor to resume at from a saved state; UserError naming each field that differs from this dataset/config
  // (or is missing). The mesh and host count may differ (elastic).
  DataCursor check_state(const nlohmann::json& saved) const;

 private:
  // What identifies the batches: every field of state() except the cursor.
  nlohmann::json identity() const;
  void log_host_stage(const HostBatch& batch) const;
  // The training pipeline's start-up lines: the dataset, the minibatch line, the read plan, the held-out split.
  void log_training_plan(const settings::EvalSettings& eval, DataCursor start) const;

  const mesh::Mesh& mesh_;
  int host_;
  int64_t global_batch_size_, block_size_;
  uint64_t seed_;
  sharding::PartitionSpec spec_;
  bool debug_shapes_;
  int64_t debug_steps_;
  std::shared_ptr<const TokenDataset> dataset_;
  GlobalSampler sampler_;
  ReadPlan plan_;
  int64_t row_replicas_;
  DataCursor start_;
  std::vector<int64_t> taken_;  // per local device: how many batches it has taken (each touched by its thread only)
  std::unique_ptr<HostLoader> loader_;
};

// The sampler of a pipeline over `dataset` (opened from dataset.path, or eval.dataset for an evaluation): training
// draws from the samples not held out, a new order each epoch; evaluation from the held-out ones (or all of
// eval.dataset), eval.batches batches in one fixed order. UserError naming the eval.* key that does not fit.
GlobalSampler sampler_for(const settings::Settings& settings, const TokenDataset& dataset,
                          DataPipeline::Purpose purpose);

}  // namespace meshtrain::data
