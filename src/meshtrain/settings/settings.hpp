// settings.hpp — Settings: the run's configuration as one typed tree, made from a Config once at start-up and
// validated there (UserError naming the key and what was expected). It is the only code that reads config keys by
// name: every other part takes the branch of the tree it needs. Plain, immutable data once made: device threads share
// it freely (a Config is a yaml-cpp tree, unsafe to read from several threads).
//
// Each key is declared where settings.cpp reads it, with its attributes: whether it changes what a run computes
// (a resumed run refuses a checkpoint trained with another value: trajectory()) and whether hosts of one job may set
// it differently (the start-up agreement compares the others: host_shared()). Every key of the config is declared.
#pragma once

#include "meshtrain/common/log.hpp"
#include "meshtrain/config/config.hpp"
#include "meshtrain/config/llama_config.hpp"
#include "meshtrain/mesh/mesh.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::settings {

struct KeyAttributes {
  bool changes_results = true;            // part of the run's trajectory: model, data, optimizer, schedule, batch, seed
  bool may_differ_between_hosts = false;  // a host-local choice: where it writes or reads, its threads, its log level
};

enum class ComputeDtype { float32, bfloat16 };
// How bf16 matmuls run (model/compute_matmul.hpp): the CPU decides (auto), libtorch's bf16 GEMM, or an fp32 GEMM of
// the bf16 values.
enum class Bf16Matmul { automatic, native, fp32_gemm };
std::optional<Bf16Matmul> bf16_matmul_from_name(const std::string& name);  // "auto", "native", "fp32_gemm"
const char* bf16_matmul_name(Bf16Matmul path);

enum class LrDecay { cosine, linear, constant };

// optimizer.*: AdamW's hyperparameters (train/adamw.hpp).
struct OptimizerSettings {
  double learning_rate = 1e-3;  // the peak rate; the schedule scales it
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0.01;
};

// lr_scheduler.*: a linear warmup, then the decay to min_lr_ratio x learning_rate at max_steps (train/lr_schedule.hpp).
struct LrSchedulerSettings {
  LrDecay decay = LrDecay::cosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
};

// dataset.path and data.*: what the host loader reads and how (data/pipeline.hpp).
struct DataSettings {
  std::string dataset_path;    // a token-shard directory or a name under assets/shards
  std::string input_sharding;  // a PartitionSpec's text (sharding/spec.hpp), parsed against the mesh by the read plan
  int prefetch_steps = 2;
  int loader_threads = 2;
  bool document_mask = false;  // each token attends only to its own document (the model's RopeTables)
};

// eval.*: held-out evaluation every every_steps steps (0: none), over `batches` global batches.
struct EvalSettings {
  int64_t every_steps = 0;
  int64_t batches = 4;
  double holdout_fraction = 0.05;  // of dataset.path's samples, while evaluating without a dataset of its own
  std::string dataset;             // a prepared dataset to evaluate on; "" for the held-out samples

  bool enabled() const { return every_steps > 0; }
  bool from_holdout() const { return dataset.empty(); }
};

// checkpoint.*
struct CheckpointSettings {
  int64_t save_steps = 0;  // 0: only at the end
  int64_t keep = 2;
  bool resume = true;
  std::string init_from;  // a Hugging Face checkpoint directory; "" for none
};

// parallel.*, moe.capacity_factor and activation_checkpointing: how the model is laid out (parallel_model.hpp).
struct ParallelSettings {
  bool reshard_after_forward = true;
  double capacity_factor = 0;  // 0: dropless
  int checkpoint_every = 0;    // activation_checkpointing: 0 none, 1 full, k every_<k>
};

// pipeline.*: how a mesh with pipeline > 1 runs its stages (parallel/pipeline_schedule.hpp).
enum class PipelineSchedule { gpipe, one_f_one_b };
struct PipelineSettings {
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t microbatches = 0;               // per forward/backward pass of a device's rows; 0: one per row
  int virtual_stages = 1;                 // stages per pipeline rank (interleaved schedules)
  std::vector<int64_t> layers_per_stage;  // of every stage; empty: balanced by compute
};

struct MemorySettings {
  bool check = true;
  double cache_slack = 0.5;
};

struct MetricsSettings {
  int64_t logging_steps = 10;
  double peak_gflops = 0;  // 0: measured at start-up
  bool tensorboard = true;
};

// debug.fault / fault_step / fault_device: a failure the failure tests inject on one device at one step.
struct FaultInjection {
  enum class Kind { none, throw_error, hang, kill, kill_in_save };
  Kind kind = Kind::none;
  int64_t step = 0;
  int device = 0;

  bool fires(Kind k, int64_t at_step, int on_device) const { return kind == k && step == at_step && device == on_device; }
};

struct DebugSettings {
  bool data_shapes = false;
  int64_t data_shape_steps = 2;
  FaultInjection fault;
};

// ici_mesh.* and dcn_mesh.*: axis sizes as written (one may be -1: mesh::Mesh::create resolves it).
struct MeshSettings {
  mesh::AxisSizes ici, dcn;
};

// runtime.*: the host runtime's threads and timeouts (runtime/host_runtime.hpp).
struct RuntimeSettings {
  int threads_per_device = 0;  // 0: the host's cores split between its devices
  double failure_timeout_s = 30;
  double heartbeat_interval_s = 1;
  double rendezvous_timeout_s = 120;
  double collective_timeout_s = 600;
  double step_timeout_s = 600;  // 0: no hang detection
};

struct Settings {
  std::filesystem::path output_dir;
  log::Level log_level = log::Level::info;
  uint64_t seed = 0;
  int64_t global_batch_size = 0, block_size = 0, max_steps = 0;
  int64_t gradient_accumulation_steps = 1;  // micro-batches per optimizer step
  double max_grad_norm = 0;                 // 0 or less: no clipping
  ComputeDtype compute_dtype = ComputeDtype::float32;
  Bf16Matmul bf16_matmul = Bf16Matmul::automatic;
  config::LlamaConfig model;
  OptimizerSettings optimizer;
  LrSchedulerSettings lr_scheduler;
  DataSettings data;
  EvalSettings eval;
  CheckpointSettings checkpoint;
  ParallelSettings parallel;
  PipelineSettings pipeline;
  MemorySettings memory;
  MetricsSettings metrics;
  DebugSettings debug;
  MeshSettings mesh;
  RuntimeSettings runtime;

  // Reads and validates every key of `config`; UserError naming the key for a missing, mistyped or out-of-range value.
  static Settings from_config(const config::Config& config);

  // The tokens of one global batch: global_batch_size x block_size.
  int64_t tokens_per_step() const { return global_batch_size * block_size; }
  // Where checkpoints go: <output_dir>/checkpoints.
  std::filesystem::path checkpoints_dir() const { return output_dir / "checkpoints"; }
  // The keys that change what the run computes, with their values as YAML text: saved with every checkpoint.
  std::map<std::string, std::string> trajectory() const;
  // The keys every host of a job must set alike, with their values: compared at start-up (runtime/job_agreement.hpp).
  std::map<std::string, std::string> host_shared() const;
  // The attributes a key was declared with; internal error for a key the config did not have.
  KeyAttributes attributes(const std::string& key) const;
  // The resolved config as YAML (logged at start-up and saved as <output_dir>/config.yaml).
  const std::string& resolved_yaml() const { return resolved_yaml_; }

 private:
  struct DeclaredKey {
    std::string value_text;  // as YAML text: "0.003", "[1, 2]", "~"
    KeyAttributes attributes;
  };
  std::map<std::string, DeclaredKey> keys_;
  std::string resolved_yaml_;
  friend class KeyReader;
};

}  // namespace meshtrain::settings
