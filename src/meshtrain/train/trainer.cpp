// trainer.cpp — train_host: resume, the data pipeline, and the SPMD training step on every local device.
#include "meshtrain/train/trainer.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/data/pipeline.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/parallel/parallel_model.hpp"
#include "meshtrain/train/adamw.hpp"
#include "meshtrain/train/checkpoint_dirs.hpp"
#include "meshtrain/train/grad_clip.hpp"
#include "meshtrain/train/lr_schedule.hpp"
#include "meshtrain/train/mesh_checkpoint.hpp"
#include "meshtrain/train/metrics.hpp"
#include "meshtrain/train/training_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

using mesh::Axis;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

torch::Dtype compute_dtype_of(const config::Config& config) {
  const std::string name = config.get_string("compute_dtype");
  if (name == "float32") return torch::kFloat32;
  if (name == "bfloat16") return torch::kBFloat16;
  throw UserError(fmt::format("compute_dtype={}: expected float32 or bfloat16", name));
}

// How many devices of the (data, fsdp) group hold each row of the batch: the gradient-reduction axes the input
// sharding leaves out. UserError if the batch is split over `tensor` (its ranks must see the same rows).
int64_t row_replicas(const mesh::Mesh& mesh, const sharding::PartitionSpec& spec) {
  const std::vector<Axis>& batch_axes = spec.dims.at(0);
  auto splits_over = [&](Axis a) { return std::find(batch_axes.begin(), batch_axes.end(), a) != batch_axes.end(); };
  MT_USER_CHECK(!splits_over(Axis::tensor) || mesh.size(Axis::tensor) == 1,
                "data.input_sharding splits the batch over tensor, but the ranks of a tensor-parallel group must see "
                "the same rows; shard the batch over data and fsdp only");
  int64_t replicas = 1;
  for (Axis a : {Axis::data, Axis::fsdp})
    if (!splits_over(a)) replicas *= mesh.size(a);
  return replicas;
}

struct ResumePoint {
  fs::path dir;
  TrainingState state;
};

std::optional<ResumePoint> find_resume_point(const config::Config& config, const fs::path& checkpoints) {
  if (!config.get_bool("checkpoint.resume")) return std::nullopt;
  const std::optional<fs::path> dir = newest_complete_checkpoint(checkpoints);
  if (!dir) return std::nullopt;
  model::verify_checkpoint_files(*dir);
  ResumePoint point{*dir, read_training_state(*dir)};
  const std::vector<std::string> changes = config_changes(point.state, config);
  MT_USER_CHECK(changes.empty(),
                "{} was trained with another configuration ({}); resuming would not continue that run. Use another "
                "output_dir, or checkpoint.resume=false to start over",
                dir->string(), fmt::join(changes, "; "));
  return point;
}

}  // namespace

void train_host(const config::Config& config, const mesh::Mesh& mesh, int host, runtime::HostRuntime& runtime) {
  const fs::path output_dir = config.get_string("output_dir");
  const fs::path checkpoints = output_dir / "checkpoints";
  const model::LlamaConfig model_config = model::LlamaConfig::from_run_config(config);
  const int64_t max_steps = config.get_int("max_steps");
  const int64_t global_batch_size = config.get_int("global_batch_size"), block_size = config.get_int("block_size");
  const int64_t micro_batches = config.get_int("gradient_accumulation_steps");
  const int64_t save_steps = config.get_int("checkpoint.save_steps"), keep = config.get_int("checkpoint.keep");
  const double max_grad_norm = config.get_float("max_grad_norm");
  const torch::Dtype compute_dtype = compute_dtype_of(config);
  MT_USER_CHECK(max_steps >= 1, "max_steps={}: expected at least 1", max_steps);
  MT_USER_CHECK(micro_batches >= 1, "gradient_accumulation_steps={}: expected at least 1", micro_batches);
  MT_USER_CHECK(block_size <= model_config.max_position_embeddings,
                "block_size={} is longer than the model's max_position_embeddings ({})", block_size,
                model_config.max_position_embeddings);
  const parallel::ParallelOptions parallel_options{config.get_bool("parallel.reshard_after_forward")};
  const AdamWOptions adamw_options = AdamWOptions::from_config(config);
  const LrSchedule schedule = LrSchedule::from_config(config);

  const std::optional<ResumePoint> resume = find_resume_point(config, checkpoints);
  const int64_t start_step = resume ? resume->state.step : 0;
  if (start_step >= max_steps) {
    log::info("Nothing to train: {} is at step {} and max_steps={} (use another output_dir, or "
              "checkpoint.resume=false to start over)", resume->dir.string(), start_step, max_steps);
    return;
  }
  data::DataCursor start_cursor;
  if (resume && resume->state.data_state.contains("epoch") && resume->state.data_state.contains("step"))
    start_cursor = {resume->state.data_state["epoch"].get<int64_t>(), resume->state.data_state["step"].get<int64_t>()};
  data::DataPipeline pipeline(config, mesh, host, start_cursor);
  if (resume) {
    MT_CHECK(pipeline.check_state(resume->state.data_state) == start_cursor, "the resumed data cursor moved");
    log::info("Resuming from {} (step {}, data epoch {} step {})", resume->dir.string(), start_step,
              start_cursor.epoch, start_cursor.step);
  }
  MT_USER_CHECK(model_config.vocab_size >= pipeline.vocab_size(),
                "the model's vocab_size ({}) is smaller than the vocabulary of the dataset's tokenizer ({}, {}): pick "
                "a model and dataset that fit (model=llama-tiny with dataset=moby-dick-byte), or widen the model "
                "(model.vocab_size=50304 for dataset=moby-dick-gpt2)", model_config.vocab_size, pipeline.vocab_size(),
                pipeline.tokenizer_fingerprint());
  const std::string init_from = config.get_string("checkpoint.init_from");

  MetricsLogger metrics(config, host == 0, peak_flops_per_device(config, compute_dtype, runtime.threads_per_device()),
                        start_step + 1);
  const int64_t global_tokens = global_batch_size * block_size;
  log::info("Training a Llama of {} layers x {} hidden ({} parameters), steps {}..{}: global batch {} x {} = {} tokens "
            "per step, {} micro-batch{} per step, {} on {} devices", model_config.num_hidden_layers,
            model_config.hidden_size, model_config.parameter_count(),
            start_step + 1, max_steps, global_batch_size, block_size, global_tokens, micro_batches,
            micro_batches == 1 ? "" : "es", compute_dtype == torch::kBFloat16 ? "bf16 matmuls" : "fp32",
            mesh.num_devices());

  runtime.run_on_devices([&](runtime::DeviceContext& ctx) {
    const bool reporter = ctx.info().local == 0;
    auto model = std::make_shared<model::LlamaForCausalLM>(model_config);
    if (resume)
      model::load_hf_checkpoint(resume->dir, *model);
    else if (!init_from.empty())
      model::load_hf_checkpoint(init_from, *model);
    else
      model::initialize_parameters(*model, static_cast<uint64_t>(config.get_int("seed")));
    model->set_compute_dtype(compute_dtype);
    parallel::ParallelModel parallel_model(model, ctx, parallel_options);
    AdamW optimizer(adamw_options, parallel_model.parameter_shards());
    if (resume) load_optimizer_state(resume->dir, parallel_model, optimizer);
    if (ctx.device() == 0) log::info("Memory: {}", parallel_model.memory_summary());
    runtime::Comm& batch_comm = ctx.over({Axis::data, Axis::fsdp});

    for (int64_t step = start_step + 1; step <= max_steps; ++step) {
      const Clock::time_point step_start = Clock::now();
      const double comm_before = ctx.counters().total_seconds();
      data::DeviceBatch batch = pipeline.next(ctx);
      const double replicas = static_cast<double>(row_replicas(ctx.mesh(), batch.input_ids.spec()));
      const at::Tensor inputs_BT = batch.input_ids.local().to(at::kLong);
      const at::Tensor labels_BT = batch.labels.local().to(at::kLong);
      MT_USER_CHECK(inputs_BT.size(0) % micro_batches == 0,
                    "gradient_accumulation_steps={} does not divide the {} rows each device holds (global_batch_size "
                    "{} over the mesh)", micro_batches, inputs_BT.size(0), global_batch_size);
      double local_loss_sum = 0;
      const std::vector<at::Tensor> input_chunks = inputs_BT.chunk(micro_batches, 0);
      const std::vector<at::Tensor> label_chunks = labels_BT.chunk(micro_batches, 0);
      for (int64_t m = 0; m < micro_batches; ++m) {
        const at::Tensor logits_BTV = parallel_model.forward(input_chunks[m]);
        const at::Tensor loss_sum = torch::nn::functional::cross_entropy(
            logits_BTV.reshape({-1, logits_BTV.size(-1)}), label_chunks[m].reshape({-1}),
            torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
        (loss_sum / (static_cast<double>(global_tokens) * replicas)).backward();
        parallel_model.finish_backward();
        local_loss_sum += loss_sum.item<double>();
      }
      parallel_model.synchronize_gradients();
      const double grad_norm = parallel_model.gradient_norm();
      std::vector<at::Tensor> grads = parallel_model.gradient_shards();
      scale_(grads, clip_coefficient(grad_norm, max_grad_norm));
      const double lr = schedule.at(step);
      optimizer.step(grads, lr);
      parallel_model.zero_gradients();
      at::Tensor loss = at::tensor({local_loss_sum}, at::kDouble);
      batch_comm.allreduce_sum(loss);

      StepMetrics m;
      m.step = step;
      m.epoch = batch.cursor.epoch;
      m.loss = loss.item<double>() / replicas / static_cast<double>(global_tokens);
      m.grad_norm = grad_norm;
      m.learning_rate = lr;
      m.step_seconds = seconds_since(step_start);
      m.data_wait_seconds = batch.wait_seconds;
      m.comm_seconds = ctx.counters().total_seconds() - comm_before;
      m.compute_seconds = std::max(0.0, m.step_seconds - m.data_wait_seconds - m.comm_seconds);
      m.tokens = global_tokens;
      m.num_devices = ctx.mesh().num_devices();
      m.flops_per_token = static_cast<double>(model_config.training_flops_per_token(block_size));
      if (reporter) metrics.log(m);

      if ((save_steps > 0 && step % save_steps == 0) || step == max_steps) {
        data::DataCursor next = batch.cursor;
        if (++next.step == pipeline.batches_per_epoch()) next = {next.epoch + 1, 0};
        const TrainingState state = TrainingState::for_config(config, step, step * global_tokens, pipeline.state(next));
        save_mesh_checkpoint(checkpoint_dir_for_step(checkpoints, step), ctx, parallel_model, optimizer, state);
        if (ctx.device() == 0) remove_old_checkpoints(checkpoints, keep);
      }
    }
    if (reporter) {
      metrics.finish();
      log::info("device {} (host {}): collectives issued: {}", ctx.device(), ctx.host(), ctx.counters().summary());
    }
  });
  log::info("Training finished on host {} at step {}", host, max_steps);
}

}  // namespace meshtrain::train
