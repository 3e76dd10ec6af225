// train_settings.hpp — everything the training loop reads from the config, resolved and validated once on the main
// thread before any device thread starts. Plain, immutable data: the device threads share it freely (a Config is a
// yaml-cpp tree, which is not safe to read from several threads; see config.hpp).
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/config/llama_config.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/parallel/parallel_model.hpp"
#include "meshtrain/train/adamw.hpp"
#include "meshtrain/train/lr_schedule.hpp"

#include <filesystem>
#include <map>
#include <string>

namespace meshtrain::train {

// compute_dtype: float32 or bfloat16 (UserError naming the key and both values otherwise).
torch::Dtype compute_dtype_of(const config::Config& config);
// bf16_matmul: auto, native or fp32_gemm (model/compute_matmul.hpp; UserError naming the key and the three values
// otherwise).
model::Bf16Matmul bf16_matmul_of(const config::Config& config);

// debug.fault / fault_step / fault_device: a failure the failure tests inject on one device at one step.
struct FaultInjection {
  enum class Kind { none, throw_error, hang, kill, kill_in_save };
  Kind kind = Kind::none;
  int64_t step = 0;
  int device = 0;

  static FaultInjection from_config(const config::Config& config);
  bool fires(Kind k, int64_t at_step, int on_device) const { return kind == k && step == at_step && device == on_device; }
};

struct TrainSettings {
  explicit TrainSettings(LrSchedule lr_schedule) : schedule(std::move(lr_schedule)) {}

  std::filesystem::path output_dir, checkpoints;  // checkpoints = output_dir/checkpoints
  config::LlamaConfig model;
  int64_t max_steps = 0, global_batch_size = 0, block_size = 0;
  int64_t micro_batches = 1;  // gradient_accumulation_steps
  int64_t save_steps = 0, keep = 0;
  int64_t eval_every_steps = 0;  // eval.every_steps: 0 = no evaluation
  double max_grad_norm = 0;
  torch::Dtype compute_dtype = torch::kFloat32;
  parallel::ParallelOptions parallel;
  AdamWOptions adamw;
  LrSchedule schedule;
  uint64_t seed = 0;
  bool resume = true;
  std::string init_from;  // a Hugging Face checkpoint directory; "" for none
  std::map<std::string, std::string> trajectory;  // checkpoint::trajectory_config(): saved with every checkpoint
  FaultInjection fault;

  // UserError naming the key for a missing or out-of-range value.
  static TrainSettings from_config(const config::Config& config);
};

}  // namespace meshtrain::train
