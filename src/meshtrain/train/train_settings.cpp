// train_settings.cpp — TrainSettings::from_config: the trainer's keys, read and checked in one place.
#include "meshtrain/train/train_settings.hpp"

#include "meshtrain/checkpoint/training_state.hpp"
#include "meshtrain/common/error.hpp"

#include <algorithm>

namespace meshtrain::train {

torch::Dtype compute_dtype_of(const config::Config& config) {
  const std::string name = config.get_string("compute_dtype");
  if (name == "float32") return torch::kFloat32;
  if (name == "bfloat16") return torch::kBFloat16;
  throw UserError(fmt::format("compute_dtype={}: expected float32 or bfloat16", name));
}

model::Bf16Matmul bf16_matmul_of(const config::Config& config) {
  const std::string name = config.get_string("bf16_matmul");
  const std::optional<model::Bf16Matmul> path = model::bf16_matmul_from_name(name);
  MT_USER_CHECK(path, "bf16_matmul={}: expected auto (the CPU's flags and a probe decide), native (libtorch's bf16 "
                "GEMM) or fp32_gemm (an fp32 GEMM of the bf16 values)", name);
  return *path;
}

FaultInjection FaultInjection::from_config(const config::Config& config) {
  static const std::pair<const char*, Kind> kinds[] = {{"none", Kind::none},
                                                       {"throw", Kind::throw_error},
                                                       {"hang", Kind::hang},
                                                       {"kill", Kind::kill},
                                                       {"kill_in_save", Kind::kill_in_save}};
  FaultInjection fault;
  const std::string name = config.get_string("debug.fault");
  auto found = std::find_if(std::begin(kinds), std::end(kinds), [&](const auto& k) { return name == k.first; });
  MT_USER_CHECK(found != std::end(kinds), "debug.fault={}: expected none, throw, hang, kill or kill_in_save", name);
  fault.kind = found->second;
  fault.step = config.get_int("debug.fault_step");
  fault.device = static_cast<int>(config.get_int("debug.fault_device"));
  return fault;
}

TrainSettings TrainSettings::from_config(const config::Config& config) {
  TrainSettings s(LrSchedule::from_config(config));
  s.output_dir = config.get_string("output_dir");
  s.checkpoints = s.output_dir / "checkpoints";
  s.model = config::LlamaConfig::from_run_config(config);
  s.max_steps = config.get_int("max_steps");
  s.global_batch_size = config.get_int("global_batch_size");
  s.block_size = config.get_int("block_size");
  s.micro_batches = config.get_int("gradient_accumulation_steps");
  s.save_steps = config.get_int("checkpoint.save_steps");
  s.keep = config.get_int("checkpoint.keep");
  s.eval_every_steps = config.get_int("eval.every_steps");
  s.max_grad_norm = config.get_float("max_grad_norm");
  s.compute_dtype = compute_dtype_of(config);
  s.parallel.reshard_after_forward = config.get_bool("parallel.reshard_after_forward");
  s.parallel.capacity_factor = config.get_float("moe.capacity_factor");
  MT_USER_CHECK(s.parallel.capacity_factor >= 0, "moe.capacity_factor must be 0 (dropless) or positive, got {}",
                s.parallel.capacity_factor);
  s.parallel.gather_dtype = s.compute_dtype;  // bf16 compute gathers bf16 (parallel_model.hpp)
  s.parallel.checkpoint_every =
      parallel::ParallelOptions::parse_checkpoint_every(config.get_string("activation_checkpointing"));
  s.adamw = AdamWOptions::from_config(config);
  s.seed = static_cast<uint64_t>(config.get_int("seed"));
  s.resume = config.get_bool("checkpoint.resume");
  s.init_from = config.get_string("checkpoint.init_from");
  s.trajectory = checkpoint::trajectory_config(config);
  s.fault = FaultInjection::from_config(config);
  MT_USER_CHECK(s.max_steps >= 1, "max_steps={}: expected at least 1", s.max_steps);
  MT_USER_CHECK(s.eval_every_steps >= 0, "eval.every_steps={}: expected 0 (no evaluation) or more",
                s.eval_every_steps);
  MT_USER_CHECK(s.micro_batches >= 1, "gradient_accumulation_steps={}: expected at least 1", s.micro_batches);
  MT_USER_CHECK(s.block_size <= s.model.max_position_embeddings,
                "block_size={} is longer than the model's max_position_embeddings ({})", s.block_size,
                s.model.max_position_embeddings);
  return s;
}

}  // namespace meshtrain::train
